"""The server side of scripts/load: one tessera-server process on loopback (the e2e tests'
launcher: ports chosen by the server, data and log in the run's work directory), a once-a-second
sampler of its memory and threads, its CPU time and Prometheus counters, and facts about the
machine."""

import hashlib
import os
import platform
import re
import subprocess
import sys
import threading
import time
import urllib.request

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "e2e"))  # the e2e tests' server launcher
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))  # machine.py

import e2e_util  # noqa: E402  (also puts client/python on the path)
import machine  # noqa: E402


class ServerProcess(e2e_util.Server):
    """e2e_util.Server as scripts/load runs it: data in work_dir/data, its log in work_dir, the
    server's default thread count, no health call before the traffic (its flags may require API
    keys), metrics optional; plus the samplers below. Not thread-safe except `status_fields` and
    `cpu_seconds`, which only read /proc."""

    def __init__(self, binary, work_dir, extra_args=(), metrics=True):
        super().__init__(*extra_args, binary=binary, work_dir=work_dir, threads=None,
                         metrics=metrics, wait_healthy=False)

    # /proc --------------------------------------------------------------------------------------

    def status_fields(self):
        """(VmRSS in MB, Threads) from /proc/PID/status, or None once the process is gone."""
        process = self.process
        if process is None:
            return None
        try:
            with open(f"/proc/{process.pid}/status") as f:
                text = f.read()
        except OSError:
            return None
        rss = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
        threads = re.search(r"^Threads:\s+(\d+)", text, re.M)
        if not rss:
            return None
        return int(rss.group(1)) / 1024.0, int(threads.group(1)) if threads else 0

    def cpu_seconds(self):
        """User + system CPU seconds of the server so far (0 if unknown)."""
        process = self.process
        if process is None:
            return 0.0
        try:
            with open(f"/proc/{process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    # Prometheus ---------------------------------------------------------------------------------

    def scrape(self):
        """{(metric, labels): value} of the counters and histogram sums/counts scripts/load reads,
        or {} when metrics are off or unreachable."""
        if not self.metrics_port:
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return {}
        values = {}
        for line in text.splitlines():
            match = re.match(r"^(tessera_rpc_total|tessera_rpc_duration_seconds_(?:sum|count))"
                             r"\{([^}]*)\} (\S+)$", line)
            if match:
                values[(match.group(1), match.group(2))] = float(match.group(3))
        return values


class Sampler:
    """Once a second: the server's RSS and thread count, as [t_s, value] with t_s measured from
    the server's start. Runs on its own thread until `stop()`."""

    def __init__(self, server, interval=1.0):
        self.server = server
        self.interval = interval
        self.rss = []
        self.threads = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()

    def now(self):
        return time.monotonic() - self.server.started_at

    def sample(self):
        fields = self.server.status_fields()
        if fields is None:
            return None
        t = round(self.now(), 2)
        with self._lock:
            self.rss.append([t, round(fields[0], 1)])
            self.threads.append([t, fields[1]])
        return fields

    def between(self, t0, t1):
        """The RSS samples with t0 ≤ t_s ≤ t1 (MB values)."""
        with self._lock:
            return [mb for t, mb in self.rss if t0 <= t <= t1]

    def threads_between(self, t0, t1):
        with self._lock:
            return [n for t, n in self.threads if t0 <= t <= t1]

    def _run(self):
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def binary_facts(path):
    """sha256 and modification time of the server binary, and the repository's HEAD: which
    server a result belongs to when the tree keeps changing."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    head = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse",
                           "HEAD"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True).stdout.strip()
    return {"binary": os.path.abspath(path), "sha256": digest.hexdigest(),
            "mtime": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(os.path.getmtime(path))),
            "git_head": head or None}


def machine_facts():
    memory_gb = None
    try:
        with open("/proc/meminfo") as f:
            match = re.search(r"^MemTotal:\s+(\d+) kB", f.read(), re.M)
            memory_gb = round(int(match.group(1)) / 2**20, 1) if match else None
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        **machine.describe(),
        "memory_gb": memory_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": list(os.getloadavg()),
    }


def machine_busy_seconds():
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat (all processes,
    including anything else running on it)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick
