"""What the PyTorch sides of the benchmarks share: the process's peak RSS as /proc reports it."""


def peak_rss_gib():
    """VmHWM of this process in GiB (0 where /proc has none)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30
    except OSError:
        pass
    return 0.0
