#!/usr/bin/env python3
"""Load for scripts/soak.sh: clients sending chat completions to kvroute back to back, every request's outcome
classified, and the router process sampled (RSS, open fds, sockets in CLOSE-WAIT).

Outcomes:
  completed          200 and a whole answer (a stream ending with data: [DONE])
  failed_clean       an error status with a JSON error body, before any byte of an answer
  stream_error_event a stream that ended with an error event (data: {"error": ...}) and no [DONE]
  cut_silently       anything else: a stream without [DONE] or error event, a truncated body, a reset (goal: 0)
  router_unreachable the router itself refused the connection (goal: 0)
"""
import argparse
import http.client
import json
import os
import random
import socket
import threading
import time


def close_wait_sockets(pid):
    """Sockets of process `pid` in CLOSE-WAIT (state 08 in /proc/net/tcp{,6})."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return -1
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "08" and parts[9] in inodes:
                        n += 1
        except OSError:
            pass
    return n


def sample(pid):
    rss_kb = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return {"rss_mib": round(rss_kb / 1024, 1), "fds": fds, "close_wait": close_wait_sockets(pid)}


class Client(threading.Thread):
    def __init__(self, index, args, deadline, counts, lock, errors):
        super().__init__(daemon=True)
        self.rng = random.Random(index)
        self.args, self.deadline, self.counts, self.lock, self.errors = args, deadline, counts, lock, errors
        self.conn = None

    def count(self, outcome, detail=""):
        with self.lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            if detail and outcome in ("cut_silently", "router_unreachable") and len(self.errors) < 50:
                self.errors.append(f"{outcome}: {detail}")

    def run(self):
        while time.monotonic() < self.deadline:
            self.one()

    def one(self):
        stream = self.rng.random() < 0.8
        topic = self.rng.randrange(40)  # shared prefixes, as conversations on one system prompt
        body = {
            "model": "qwen3-8b",
            "messages": [
                {"role": "system", "content": f"You are assistant {topic}. " + "Be helpful and precise. " * 20},
                {"role": "user", "content": f"question {self.rng.randrange(10**9)}"},
            ],
            "max_tokens": self.rng.randrange(16, 400),
        }
        if stream:
            body["stream"] = True
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.args.host, self.args.port, timeout=self.args.timeout)
        try:
            self.conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        except ConnectionRefusedError as e:
            self.conn = None
            time.sleep(0.1)
            return self.count("router_unreachable", str(e))
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            self.conn = None
            return self.count("cut_silently", f"before the head: {e!r}")
        try:
            if resp.status != 200:
                data = resp.read()
                try:
                    ok = "error" in json.loads(data)
                except ValueError:
                    ok = False
                self.count("failed_clean" if ok else "cut_silently", f"status {resp.status}: {data[:200]!r}")
                if resp.will_close:
                    self.conn.close()
                    self.conn = None
                return
            if not stream:
                data = json.loads(resp.read())
                return self.count("completed" if data.get("choices") else "cut_silently", str(data)[:200])
            done = error_event = False
            while True:
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b'data: {"error"'):
                    error_event = True
            if done and not error_event:
                self.count("completed")
            elif error_event and not done:
                self.count("stream_error_event")
            else:
                self.count("cut_silently", f"stream ended: done={done} error_event={error_event}")
            if resp.will_close:
                self.conn.close()
                self.conn = None
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.conn.close()
            self.conn = None
            self.count("cut_silently", f"after the head: {e!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", default="127.0.0.1:8080")
    p.add_argument("--duration", type=float, default=600)
    p.add_argument("--clients", type=int, default=12)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--router-pid", type=int, required=True)
    p.add_argument("--sample-every", type=float, default=10)
    p.add_argument("--settle", type=float, default=8, help="seconds between the load's end and the final sample")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.host, args.port = args.target.rsplit(":", 1)
    args.port = int(args.port)
    deadline = time.monotonic() + args.duration
    counts, errors, lock = {}, [], threading.Lock()
    clients = [Client(i, args, deadline, counts, lock, errors) for i in range(args.clients)]
    for c in clients:
        c.start()
    samples, t0 = [], time.monotonic()
    while any(c.is_alive() for c in clients):
        s = sample(args.router_pid)
        if s:
            s["t"] = round(time.monotonic() - t0)
            with lock:
                s["requests"] = sum(counts.values())
            samples.append(s)
            print(json.dumps(s), flush=True)
        end = time.monotonic() + args.sample_every
        while time.monotonic() < end and any(c.is_alive() for c in clients):
            time.sleep(0.5)
    for c in clients:
        c.join(args.timeout)
    time.sleep(args.settle)  # idle pooled connections: the workers close theirs after --idle-timeout
    final = sample(args.router_pid)
    with open(args.out, "w") as f:
        json.dump({"counts": counts, "samples": samples, "final": final, "errors": errors}, f, indent=1)
    print(json.dumps({"counts": counts, "final": final}))


if __name__ == "__main__":
    main()
