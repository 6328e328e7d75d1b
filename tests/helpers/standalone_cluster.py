"""A Spark standalone cluster on 127.0.0.1 (master + workers from pyspark's own ``bin/spark-class``).

Used by tests that need separate executor processes (memory limits, lost executors).
Every process runs in its own process group and is killed on :meth:`StandaloneCluster.stop`.
:meth:`StandaloneCluster.kill_worker` ``kill -9``s one worker with its executor JVM and
the executor's Python processes (a lost machine); :meth:`StandaloneCluster.restart_worker`
brings it back.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark
    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


class StandaloneCluster:
    """Master and ``workers`` workers (``cores`` cores, ``memory`` each) on 127.0.0.1.

    Args:
        workers: number of worker processes.
        cores: cores each worker offers.
        memory: memory each worker offers (Spark's accounting, e.g. ``"3g"``).
        start_timeout: seconds to wait for the master and all workers.
    """

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "3g",
                 start_timeout: float = 90.0) -> None:
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.start_timeout = start_timeout
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[int, subprocess.Popen] = {}
        self.dir = tempfile.mkdtemp(prefix="sparknet-standalone-")
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.base_env = dict(os.environ)   # as at its creation (it may start in another thread)

    def _env(self) -> dict:
        env = dict(self.base_env)
        env.update({"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_DIRS": self.dir,
                    "SPARK_WORKER_DIR": os.path.join(self.dir, "work"),
                    "SPARK_LOG_DIR": self.dir, "PYSPARK_PYTHON": sys.executable,
                    "SPARK_NO_DAEMONIZE": "1"})
        if env.get("SPARKNET_TEST_JAVA_OPTIONS") and "JAVA_TOOL_OPTIONS" not in env:
            # the daemons and the executors they start (helpers/quick_jvm.py)
            env["JAVA_TOOL_OPTIONS"] = env["SPARKNET_TEST_JAVA_OPTIONS"]
        return env

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        with open(os.path.join(self.dir, log), "ab") as fh:
            proc = subprocess.Popen([spark_class(), *args], stdout=fh, stderr=subprocess.STDOUT,
                                    env=self._env(), start_new_session=True)
        self.procs.append(proc)
        return proc

    def _spawn_worker(self, i: int) -> None:
        self.workers[i] = self._spawn(
            ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
             "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
             "--work-dir", os.path.join(self.dir, f"work{i}")], f"worker{i}.log")

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                state = json.loads(r.read().decode())
        except (OSError, ValueError):
            return -1
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def start(self) -> "StandaloneCluster":
        self._spawn(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui_port)], "master.log")
        deadline = time.time() + self.start_timeout
        while self.alive_workers() < 0:
            self._check(deadline, "master")
        for i in range(self.n_workers):
            self._spawn_worker(i)
        while self.alive_workers() < self.n_workers:
            self._check(deadline, "workers")
        return self

    def worker_tree(self, i: int) -> list[int]:
        """Pids of worker ``i`` and of every process below it (executor JVMs, their
        Python daemons and workers), parents first."""
        proc = self.workers.get(i)
        if proc is None or proc.poll() is not None:
            return []
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [proc.pid]
        while todo:
            pid = todo.pop(0)
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def executor_pids(self, i: int) -> list[int]:
        """Pids of the executor JVMs worker ``i`` launched (its ``java`` children)."""
        out = []
        for pid in self.worker_tree(i)[1:]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if any(b"CoarseGrainedExecutorBackend" in c for c in cmd):
                out.append(pid)
        return out

    def kill_worker(self, i: int) -> list[int]:
        """``kill -9`` worker ``i``, its executor JVMs and their Python processes at once
        (a machine lost); returns the pids killed."""
        pids = self.worker_tree(i)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc = self.workers.pop(i, None)
        if proc is not None:
            proc.wait(timeout=30)
        return pids

    def restart_worker(self, i: int, timeout: float = 60.0) -> None:
        """Start worker ``i`` again (after :meth:`kill_worker`) and wait until the master
        lists it alive."""
        if i in self.workers:
            raise RuntimeError(f"worker {i} is running")
        self._spawn_worker(i)
        deadline = time.time() + timeout
        while self.alive_workers() < len(self.workers):
            if time.time() > deadline:
                raise TimeoutError(f"worker {i} not back after {timeout:.0f} s; logs in {self.dir}")
            time.sleep(0.5)

    def ensure_workers(self, timeout: float = 90.0) -> "StandaloneCluster":
        """Start again every worker a test killed (a cluster shared by several tests:
        each one starts with all ``workers`` workers alive) and wait until the master
        lists them all alive.  The missing workers start at once, not one after another."""
        for i in range(self.n_workers):
            proc = self.workers.get(i)
            if proc is not None and proc.poll() is not None:
                self.workers.pop(i)
            if i not in self.workers:
                self._spawn_worker(i)
        deadline = time.time() + timeout
        while self.alive_workers() < self.n_workers:
            if time.time() > deadline:
                raise TimeoutError(f"{self.n_workers} workers not alive after {timeout:.0f} s; logs in {self.dir}")
            time.sleep(0.5)
        return self

    def _check(self, deadline: float, what: str) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"a standalone {what} process exited with {p.returncode}; logs in {self.dir}")
        if time.time() > deadline:
            raise TimeoutError(f"standalone {what} not up after {self.start_timeout:.0f} s; logs in {self.dir}")
        time.sleep(0.5)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        t0 = time.time()
        for p in self.procs:
            try:
                p.wait(timeout=max(1.0, 15 - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "StandaloneCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
