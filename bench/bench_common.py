"""What the PyTorch sides of the benchmarks share: the median time of a call after a warm-up, and the
process's peak RSS as /proc reports it."""
import time



def peak_rss_gib():
    """VmHWM of this process in GiB (0 where /proc has none)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30
    except OSError:
        pass
    return 0.0


def median_seconds(call, reps):
    """`call()` once to warm up, then `reps` timed times: the median in seconds."""
    call()
    runs = []
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    return sorted(runs)[len(runs) // 2]
