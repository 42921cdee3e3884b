#!/usr/bin/env python3
"""Scale-out benchmark: prompts per minute of `sdflow serve --queue redis://…` with 1, 2, 3…
`sdflow worker`s, beside `sdflow serve` running prompts itself, and the scheduling overhead
the queue adds to a prompt.

For each worker count N it starts a fresh redis-server (no persistence), one front end and
N workers (`-t` = max(1, cores // N) each), warms every worker up, then:

* latency: a trivial prompt (EmptyImage 8x8 -> SaveImage, a different colour each time so no
  output is cached), submitted one at a time and waited for, POST to completed history;
* throughput: K txt2img prompts on the tiny random-weight SD1 checkpoint `sdflow demo`
  writes (64x64, 4 euler steps, a distinct seed each), from C client threads that each
  submit a prompt, poll its history until it is done, and submit the next.

The single-machine row is the same on `sdflow serve` without --queue, with all the cores.
Overhead = median trivial latency with Redis - without. Python 3 stdlib only; every process
it starts is stopped on exit, every file is in a temporary folder.

    python3 bench/scale_out.py [--workers 1,2,3] [--prompts 60] [--clients 6]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

SEED_BASE = 1000


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def default_sdflow():
    """The release binary if it has `worker` (scale-out), else the debug one."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/sdflow-target")
    candidates = [os.path.join(target, p, "sdflow") for p in ("release", "debug")]
    present = [c for c in candidates if os.path.isfile(c)]
    for c in present:
        try:
            ok = subprocess.run([c, "worker", "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return c
    return present[0] if present else candidates[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process whose stdout is read line by line (the ready line is looked for
    there) and whose stderr goes to a log file."""

    def __init__(self, name, argv, cwd, logdir):
        self.name = name
        self.argv = argv
        self.err_path = os.path.join(logdir, f"{name}.stderr")
        self.err = open(self.err_path, "wb")
        self.lines = []
        self.cond = threading.Condition()
        self.p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.err, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.p.stdout:
            with self.cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, prefix, timeout):
        """The first stdout line starting with `prefix`; raises if the process exits first."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                if self.p.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.p.returncode}) before it was ready\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name} not ready after {timeout}s\n{self.tail()}")
                self.cond.wait(min(left, 0.5))

    def tail(self, n=20):
        try:
            with open(self.err_path, "rb") as f:
                text = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            text = []
        return "\n".join(f"  [{self.name}] {l}" for l in (self.lines[-n:] + text[-n:]))

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.reader.join(5)
        self.err.close()


class Api:
    def __init__(self, base):
        self.base = base

    def _req(self, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{'POST' if data else 'GET'} {path}: HTTP {e.code}: {e.read().decode('utf-8', 'replace')[:2000]}") from None

    def submit(self, prompt, client_id):
        return self._req("/prompt", {"prompt": prompt, "client_id": client_id})["prompt_id"]

    def wait(self, prompt_id, poll, timeout):
        deadline = time.monotonic() + timeout
        while True:
            entry = self._req(f"/history/{prompt_id}").get(prompt_id)
            if entry:
                status = entry.get("status") or {}
                if status.get("completed"):
                    return entry
                if status.get("status_str") == "error":
                    msgs = [m for m in status.get("messages", []) if m and m[0] == "execution_error"]
                    raise RuntimeError(f"prompt {prompt_id} failed: {json.dumps(msgs)[:2000]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"prompt {prompt_id} not done after {timeout}s")
            time.sleep(poll)

    def stats(self):
        return self._req("/system_stats")


def txt2img(seed, size, steps):
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "model.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lovely cat, (watercolor:1.2)", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry, low quality", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "seed": seed, "steps": steps, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal",
                                                   "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0], "denoise": 1.0}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "bench"}},
    }


def trivial(color):
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "trivial"}},
    }


def run_concurrent(api, prompts, clients, poll, timeout):
    """Runs `prompts` from `clients` threads (each: submit, wait, next); returns wall seconds."""
    lock = threading.Lock()
    todo = list(enumerate(prompts))
    errors = []
    entries = []

    def client(i):
        while True:
            with lock:
                if not todo or errors:
                    return
                _, p = todo.pop(0)
            try:
                entry = api.wait(api.submit(p, f"bench-{i}"), poll, timeout)
                with lock:
                    entries.append(entry)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)
                return

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    if errors:
        raise errors[0]
    check_ran(entries, len(prompts))
    return wall


def check_ran(entries, expected):
    """Every txt2img prompt saved an image and sampled for real (no KSampler served from
    a cache), so the rows compare the same work."""
    if len(entries) != expected:
        raise RuntimeError(f"{len(entries)} of {expected} prompts finished")
    for e in entries:
        if not (e.get("outputs", {}).get("7", {}).get("images")):
            raise RuntimeError(f"a prompt saved no image: {json.dumps(e)[:2000]}")
        cached = {n for m in e.get("status", {}).get("messages", []) if m and m[0] == "execution_cached" for n in m[1].get("nodes", [])}
        if "5" in cached:
            raise RuntimeError("a KSampler result came from a cache; the seeds should differ")


def trivial_latency(api, count, color_base, timeout):
    lat = []
    for i in range(count):
        t0 = time.monotonic()
        api.wait(api.submit(trivial((color_base + i) % 0xFFFFFF), "bench-lat"), 0.002, timeout)
        lat.append(time.monotonic() - t0)
    return statistics.median(lat)


def ensure_checkpoint(sdflow, tmp, timeout):
    """The tiny random-weight SD1 checkpoint of `sdflow demo` (written or refreshed by a
    64x64, 1-step demo run; kept in ~/.cache/sdflow/demo)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    ckpt = os.path.join(cache, "sdflow", "demo", "models", "checkpoints", "demo-sd1-random.safetensors")
    log("checking the demo checkpoint (sdflow demo --size 64 --steps 1)")
    r = subprocess.run([sdflow, "demo", "--size", "64", "--steps", "1", "--output-dir", os.path.join(tmp, "demo-out")],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if r.returncode != 0 or not os.path.isfile(ckpt):
        raise RuntimeError(f"sdflow demo failed ({r.returncode}), or wrote no {ckpt}:\n{r.stdout.decode('utf-8', 'replace')[-3000:]}")
    return ckpt


def start_redis(redis_bin, tmp, procs, timeout):
    port = free_port()
    rd = tempfile.mkdtemp(prefix="redis-", dir=tmp)
    p = Proc(f"redis-{port}", [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", rd], rd, tmp)
    procs.append(p)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return f"redis://127.0.0.1:{port}"
        except OSError:
            pass
        if p.p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"redis-server did not start\n{p.tail()}")
        time.sleep(0.05)


def run_mode(args, tmp, ckpt, workers, seed_base):
    """One row: `workers` = 0 is single-machine mode. Returns the row as a dict."""
    run_dir = tempfile.mkdtemp(prefix=f"run-{workers}w-", dir=tmp)
    for d in ("models/checkpoints", "input", "output"):
        os.makedirs(os.path.join(run_dir, d), exist_ok=True)
    os.symlink(ckpt, os.path.join(run_dir, "models/checkpoints/model.safetensors"))
    dirs = ["--models-dir", "models", "--input-dir", "input", "--output-dir", "output"]
    mine = []
    try:
        if workers:
            tpw = args.threads_per_worker or max(1, args.cores // workers)
            queue = start_redis(args.redis_server, run_dir, mine, args.start_timeout)
            front = Proc("serve", [args.sdflow, "serve", "--port", "0", "--queue", queue] + dirs, run_dir, run_dir)
        else:
            tpw = args.single_threads or args.cores
            front = Proc("serve", [args.sdflow, "serve", "--port", "0", "-t", str(tpw)] + dirs, run_dir, run_dir)
        mine.append(front)
        addr = front.wait_line("sdflow serving on ", args.start_timeout).split("http://", 1)[1].strip()
        api = Api(f"http://{addr}")
        for i in range(workers):
            w = Proc(f"worker{i + 1}", [args.sdflow, "worker", "--queue", queue, "--name", f"w{i + 1}", "-t", str(tpw)] + dirs, run_dir, run_dir)
            mine.append(w)
        for w in mine[2:]:
            w.wait_line("sdflow worker ", args.start_timeout)
        if workers:
            deadline = time.monotonic() + args.start_timeout
            while len(api.stats()["sdflow"]["queue"].get("workers", [])) < workers:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the front end sees fewer than {workers} workers")
                time.sleep(0.1)
        label = f"redis, {workers} worker(s) x {tpw} threads" if workers else f"single process, {tpw} threads"
        # Warm-up: 2 prompts per worker at once, so every worker loads the checkpoint.
        n_warm = 2 * max(1, workers)
        log(f"[{label}] warm-up: {n_warm} txt2img prompts")
        run_concurrent(api, [txt2img(seed_base - 1 - i, args.size, args.steps) for i in range(n_warm)], n_warm, 0.02, args.prompt_timeout)
        log(f"[{label}] trivial-prompt latency: {args.latency_prompts} sequential prompts")
        lat = trivial_latency(api, args.latency_prompts, seed_base, args.prompt_timeout)
        log(f"[{label}] throughput: {args.prompts} txt2img prompts from {args.clients} clients")
        wall = run_concurrent(api, [txt2img(seed_base + i, args.size, args.steps) for i in range(args.prompts)], args.clients, 0.02, args.prompt_timeout)
        row = {"mode": "redis" if workers else "single", "workers": workers or "-", "threads": tpw, "prompts": args.prompts, "wall": wall,
               "ppm": args.prompts * 60.0 / wall, "lat_ms": lat * 1000.0}
        log(f"[{label}] {row['ppm']:.1f} prompts/min, trivial latency {row['lat_ms']:.2f} ms")
        return row
    except Exception:
        for p in mine:
            log(p.tail())
        raise
    finally:
        for p in reversed(mine):
            p.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def on_sigterm(_sig, _frame):
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdflow", default=None, help="the sdflow binary (default: $CARGO_TARGET_DIR or ~/.cache/sdflow-target, release if it has `worker`, else debug)")
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--workers", default="1,2,3", help="worker counts, comma-separated (default 1,2,3)")
    ap.add_argument("--threads-per-worker", type=int, default=None, help="-t of each worker (default max(1, cores // N))")
    ap.add_argument("--single-threads", type=int, default=None, help="-t of the single-process server (default all cores)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, default=60, help="txt2img prompts per row (default 60)")
    ap.add_argument("--clients", type=int, default=6, help="concurrent client threads (default 6)")
    ap.add_argument("--latency-prompts", type=int, default=50, help="trivial prompts for the latency median (default 50)")
    ap.add_argument("--size", type=int, default=64, help="txt2img side in pixels (default 64)")
    ap.add_argument("--steps", type=int, default=4, help="txt2img steps (default 4)")
    ap.add_argument("--no-single", action="store_true", help="leave out the single-process row")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--prompt-timeout", type=float, default=600.0)
    args = ap.parse_args()
    args.sdflow = os.path.abspath(args.sdflow or default_sdflow())
    worker_counts = [int(x) for x in args.workers.split(",") if x.strip()]
    if not os.path.isfile(args.sdflow):
        sys.exit(f"no sdflow binary at {args.sdflow} (give --sdflow)")
    if any(n < 1 for n in worker_counts):
        sys.exit("--workers takes counts of 1 or more")
    if worker_counts and not os.path.isfile(args.redis_server):
        sys.exit(f"no redis-server at {args.redis_server} (give --redis-server)")
    log(f"sdflow: {args.sdflow}; {args.cores} cores")

    # SIGTERM unwinds like Ctrl-C, so the `finally`s stop every child.
    signal.signal(signal.SIGTERM, on_sigterm)
    tmp = tempfile.mkdtemp(prefix="sdflow-scale-out-")
    rows = []
    try:
        ckpt = ensure_checkpoint(args.sdflow, tmp, args.prompt_timeout)
        if not args.no_single:
            rows.append(run_mode(args, tmp, ckpt, 0, SEED_BASE))
        for n in worker_counts:
            rows.append(run_mode(args, tmp, ckpt, n, SEED_BASE))
    except KeyboardInterrupt:
        log("interrupted")
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        log(f"error: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if not rows:
        sys.exit(1)
    head = ("mode", "workers", "threads/worker", "prompts", "wall s", "prompts/min", "trivial median ms")
    body = [(r["mode"], str(r["workers"]), str(r["threads"]), str(r["prompts"]), f"{r['wall']:.2f}", f"{r['ppm']:.1f}", f"{r['lat_ms']:.2f}") for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print()
    print(f"txt2img: tiny random-weight SD1, {args.size}x{args.size}, {args.steps} euler steps, {args.clients} clients; "
          f"trivial: EmptyImage 8x8 -> SaveImage, {args.latency_prompts} one at a time")
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))))
    for b in body:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))))
    single = next((r for r in rows if r["mode"] == "single"), None)
    if single:
        for r in rows:
            if r["mode"] == "redis":
                print(f"scheduling overhead per prompt, {r['workers']} worker(s): {r['lat_ms'] - single['lat_ms']:+.2f} ms (redis median - single median)")
    if len(rows) < (0 if args.no_single else 1) + len(worker_counts):
        sys.exit(1)


if __name__ == "__main__":
    main()
