"""sparknet's errors raised in tasks, on the driver as themselves.

A task that fails in sparknet's code (a row of the wrong length while scoring, say) reaches
the driver inside Spark's wrappers: a ``Py4JJavaError`` of a hundred lines of Java trace, or
pyspark's ``PythonException`` holding the worker's traceback as text.  :func:`install` puts
one function between Py4J and its callers (as pyspark itself does, with
``install_exception_handler``, to turn Java errors into pyspark's own), so every call into
Spark that fails with one of sparknet's errors raises that error instead, with its own
message, at the call: ``fit``, or ``collect``/``show``/``write`` of the DataFrame that
``transform`` returned (a lazy plan only fails at its action).  Every other failure passes
through untouched.  The wrapped error goes to the log at debug level (logger
``sparknet.tasks``).

How an error says it is sparknet's, across the process boundary:

* a Python worker's exception crosses as its traceback's text, whose last line names the
  class: ``sparknet.errors.DataError: features column ...``; the classes that may cross are
  :data:`sparknet.errors.TASK_ERRORS`, looked up by that name;
* the JVM engine's Java code (``sparknet.jvm.*``) throws Java's own exception classes (a class
  of sparknet's jar could not be read back by the driver's result thread, which does not see
  the jar), and the throwing class is the mark: the top frame of the Java exception, or of
  one of its causes, is in ``sparknet.jvm``.  ``IllegalArgumentException`` (a bad row) becomes
  :class:`~sparknet.errors.DataError`, any other :class:`~sparknet.errors.TaskError`.

Spark also prints the failed task's trace on the driver's console.  That is handled in the
JVM, where the lines are written: see :func:`sparknet.cluster.engine.jar.quiet_task_errors`.
"""
from __future__ import annotations

import functools
import logging
import re
import threading
from typing import Any, Callable

from sparknet.errors import TASK_ERRORS, DataError, TaskError

log = logging.getLogger("sparknet.tasks")

#: the last line of a Python worker's traceback for one of sparknet's errors
_PYTHON_ERROR = re.compile(r"^sparknet\.errors\.(\w+): (.*)$", re.MULTILINE)
#: Java exceptions thrown by sparknet's Java code, by class, as sparknet's errors
_JAVA_ERRORS: dict[str, type[Exception]] = {"java.lang.IllegalArgumentException": DataError}
_JAVA_PACKAGE = "sparknet.jvm."
_MAX_CAUSES = 16
_LOCK = threading.Lock()


def translate(exc: BaseException) -> Exception | None:
    """The sparknet error that ``exc`` (a ``Py4JJavaError``, a pyspark ``CapturedException``
    or a Spark Connect error) carries, as a new exception of its class; None when it carries
    none."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - the gateway is gone: nothing to read
        return None
    found = _PYTHON_ERROR.findall(text)
    if found:
        name, message = found[-1]                       # the innermost: the task's own
        cls = TASK_ERRORS.get(name)
        if cls is not None:
            return cls(message.strip())
    if _JAVA_PACKAGE in text:
        java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
        if java is not None:
            return _java_error(java)
    return None


def _java_error(throwable: Any) -> Exception | None:
    """The error of the first Java exception in ``throwable``'s cause chain that sparknet's
    Java code threw (its top frame in ``sparknet.jvm``)."""
    try:
        for _ in range(_MAX_CAUSES):
            if throwable is None:
                return None
            frames = throwable.getStackTrace()
            if len(frames) and str(frames[0].getClassName()).startswith(_JAVA_PACKAGE):
                cls = _JAVA_ERRORS.get(str(throwable.getClass().getName()), TaskError)
                return cls(str(throwable.getMessage()))
            throwable = throwable.getCause()
    except Exception:  # noqa: BLE001 - the gateway is gone: keep Spark's error
        return None
    return None


def _translating(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` (Py4J's ``get_return_value``), raising sparknet's errors as themselves."""
    @functools.wraps(call)
    def get_return_value(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            ours = translate(exc)
            if ours is None:
                raise
            log.debug("a task failed in sparknet's code: %s", ours, exc_info=exc)
            raise ours from None

    get_return_value.sparknet_translates = True  # type: ignore[attr-defined]
    return get_return_value


def install() -> None:
    """Put the translation between Py4J and its callers (idempotent; again after pyspark
    re-installed its own handler, which a new session does)."""
    try:
        import py4j.java_gateway as gateway
    except ImportError:  # a Spark Connect client without Py4J: its errors are text alone
        return
    with _LOCK:
        current = gateway.get_return_value
        if not getattr(current, "sparknet_translates", False):
            gateway.get_return_value = _translating(current)
