"""The server side of scripts/load: one tessera-server process on loopback (ports chosen by the
server, data in a temporary directory), a once-a-second sampler of its memory and threads, its
CPU time and Prometheus counters, and facts about the machine."""

import hashlib
import os
import platform
import re
import signal
import subprocess
import threading
import time
import urllib.request

_LISTENING = re.compile(r"tessera-server listening on (\S+):(\d+)(?: \(metrics on port (\d+)\))?")


class ServerProcess:
    """tessera-server --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 (or "" when metrics are
    off) with its log in `log_path`. Not thread-safe except `status_fields` and `cpu_seconds`,
    which only read /proc."""

    def __init__(self, binary, data_dir, log_path, extra_args=(), metrics=True):
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.metrics = metrics
        self.process = None
        self.address = None
        self.metrics_port = None
        self.started_at = None

    def start(self, timeout=120.0):
        command = [self.binary, "--data_dir", self.data_dir, "--listen", "127.0.0.1:0",
                   "--metrics_listen", "127.0.0.1:0" if self.metrics else "", *self.extra_args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        self.started_at = time.monotonic()
        deadline = self.started_at + timeout
        while True:
            match = _LISTENING.search(self.log())
            if match:
                break
            if self.process.poll() is not None:
                raise RuntimeError(f"tessera-server exited with {self.process.returncode} before "
                                   f"listening:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"tessera-server not listening after {timeout} s:\n"
                                   f"{self.log()[-4000:]}")
            time.sleep(0.05)
        self.address = f"{match.group(1)}:{match.group(2)}"
        self.metrics_port = int(match.group(3)) if match.group(3) else None
        return self

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout=120.0):
        """SIGTERM and wait; returns the exit code ("timeout" if it had to be killed)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = "timeout"
        self.process = None
        return code

    def kill(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

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
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gb = None
    try:
        with open("/proc/meminfo") as f:
            match = re.search(r"^MemTotal:\s+(\d+) kB", f.read(), re.M)
            memory_gb = round(int(match.group(1)) / 2**20, 1) if match else None
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor(),
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
