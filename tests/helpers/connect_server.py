"""A Spark Connect server on 127.0.0.1 (``SparkConnectServer`` through pyspark's own
``bin/spark-submit``, master ``local[2]``), for the tests that run sparknet from a Connect
client.  It runs in its own process (and process group): a test process holding a Classic
session can still open a Connect session to it.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from helpers.standalone_cluster import free_port


class ConnectServer:
    """``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``.

    Args:
        master: the server's Spark master.
        conf: extra Spark settings of the server.
        start_timeout: seconds to wait for its gRPC port.
    """

    def __init__(self, master: str = "local[2]", conf: dict | None = None, start_timeout: float = 180.0) -> None:
        self.master, self.conf, self.start_timeout = master, dict(conf or {}), start_timeout
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.dir = tempfile.mkdtemp(prefix="sparknet-connect-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ConnectServer":
        import pyspark

        submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
        args = [submit, "--master", self.master, "--conf", f"spark.connect.grpc.binding.port={self.port}",
                "--conf", "spark.connect.grpc.binding.address=127.0.0.1"]
        for k, v in self.conf.items():
            args += ["--conf", f"{k}={v}"]
        args += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOCAL_DIRS=self.dir)
        with open(os.path.join(self.dir, "server.log"), "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited with {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if time.time() > deadline:
                    raise TimeoutError(f"Spark Connect server not up after {self.start_timeout:.0f} s: "
                                       f"{self.log_tail()}") from None
                time.sleep(0.5)

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(os.path.join(self.dir, "server.log"), encoding="utf-8", errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "ConnectServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
