r"""The DAPO math scorer: ``Answer:`` extraction + Minerva normalisation, as the paper's authors scored.

What it reproduces
------------------
``compute_score`` gives the same ``score`` / ``acc`` / ``pred`` as ``eval/math_dapo.py`` of the authors'
repository (github.com/BytedTsinghua-SIA/DAPO, default ``strict_box_verify=False``), which is also what
verl's ``verl/utils/reward_score/math_dapo.py`` did before it gained a ``\boxed{}`` fallback:

1. keep the last 300 characters of the response;
2. take the last match of ``(?i)Answer\s*:\s*([^\n]+)`` in them (``[INVALID]`` if there is none);
3. normalise it and the ground truth with the Minerva ``normalize_final_answer`` (keep what follows the last
   ``=``; ten ordered substitutions; 41 removed unit words and TeX fragments; per line, reduce ``..$x$..`` to
   ``$x$``; unwrap ``\text{}``, ``\textbf{}``, ``\overline{}`` up to the first ``}`` and ``\boxed{}`` up to
   the last ``}`` of the line; ``\fracab`` -> ``\frac{a}{b}``, ``\sqrta`` -> ``\sqrt{a}``; drop ``$``; drop
   thousands commas from digit strings; strip);
4. score +1.0 if the two strings are equal, else -1.0; ``acc`` is the boolean, ``pred`` the normalised answer.

There is no ``\boxed{}`` fallback: a response without ``Answer:`` scores -1 however it boxes its answer.
The code is written anew (not copied); the substitution and removal tables are the paper's, in its order.

Deliberate deviations (none changes a score the paper's scorer can compute)
---------------------------------------------------------------------------
1. Linear time. Five of the paper's normalisation regexes (``(.*?)(\$)(.*?)(\$)(.*)``, ``(\\text\{)(.*?)(\})``
   and its ``\textbf`` / ``\overline`` twins, ``(\\boxed\{)(.*)(\})``) backtrack quadratically: a 40 kB ground
   truth without ``$`` takes ~25 s there, a megabyte one hours. Each is replaced by an output-identical form
   that runs in linear time (see the comment above ``_DOLLAR_LINE``), checked against the original on
   generated strings by the tests; a megabyte of adversarial ground truth now takes well under a second.
2. Input hardening. The paper's scorer raises on anything but two strings. Here:
   ``bytes`` are decoded as UTF-8 (invalid bytes replaced); numbers (``int``, ``float``, numpy scalars, not
   ``bool``) are ``str()``-ed, so a ground truth ``204`` works like ``"204"`` (a float ``204.0`` becomes
   ``"204.0"``); any other response (``None``, lists, ...) gives ``pred="[INVALID]"`` and any other ground
   truth can never be matched; both give ``score=-1.0, acc=False``. NUL bytes and megabyte strings are
   ordinary text. No input raises or hangs.
3. Caching. Normalised answers are memoised (``functools.lru_cache``; ground truths up to 4096 characters).

Modes (keyword arguments; in verl set them under ``reward.custom_reward_function.reward_kwargs``)
--------------------------------------------------------------------------------------------------
* default: the paper's scorer, as above.
* ``boxed_fallback=True``: verl 0.9.1's scorer. Only when the normalised ``Answer:`` is ``[INVALID]``, the last
  ``\boxed{...}`` (balanced braces) in the last 100 of those 300 characters is compared, un-normalised, with
  the ground truth string; ``pred`` is then the boxed content.
* ``use_math_verify=True``: symbolic equivalence with math-verify (``0.5`` == ``\frac{1}{2}``). The strict
  comparison above runs first; math-verify can only turn a mismatch into a match, and is asked only when an
  answer was extracted. ``math_verify_timeout_s`` (default 5) bounds each check hard: it runs in a worker
  subprocess that is killed when the limit passes (the check then counts as a mismatch and a fresh worker is
  started in the background). math-verify's own timeouts are not used: they rely on ``signal.alarm``, which
  raises off the main thread (verl scores in executor threads) and cannot interrupt long C-level work such
  as big-integer arithmetic. Workers (at most ``min(4, cpu_count)``, started on first use, ~1-2 s to import
  sympy) are plain ``python -c`` processes that import only math_verify and exit when this process is gone;
  waiting for a free or starting worker is bounded separately (60 s). math_verify is never imported by this
  process. A worker that cannot start (math_verify broken) raises ``RuntimeError``: the mode was asked for.

Other keyword arguments verl may pass (``reward_router_address``, ``reward_model_tokenizer``, ...) are
accepted and ignored, as are ``data_source`` and ``extra_info``: every sample is scored as math. verl's
``strict_box_verify`` / ``pause_tokens_index`` are not implemented and raise ``ValueError`` if set.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import logging
import numbers
import os
import re
import select
import subprocess
import sys
import threading
import time

__all__ = [
    "DAPO_INSTRUCTION",
    "INVALID",
    "compute_score",
    "extract_answer",
    "normalize_final_answer",
    "shutdown_math_verify",
]

# The instruction of DAPO-Math-17k and AIME 2024 as its authors prepared them (BytedTsinghua-SIA), verbatim: the
# prompt asks for the "Answer:" line this scorer reads. Format with problem=...
DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)

logger = logging.getLogger(__name__)

INVALID = "[INVALID]"
ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
RESPONSE_TAIL_CHARS = 300  # the paper's scorer only reads the last 300 characters
BOXED_TAIL_CHARS = 100  # verl's boxed fallback reads the last 100 of those
_GT_CACHE_MAX_CHARS = 4096  # longer ground truths are normalised on every call instead of cached

# Minerva normalisation tables, applied with str.replace in this order (the order matters: "\text{m}"
# becomes "\text{}" before "\text{}^2" and "\text{}" are removed).
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED_EXPRESSIONS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)


# ----------------------------------------------------------------------------------------------------
# Minerva normalisation. The paper's regexes backtrack quadratically on some inputs; below, each is replaced
# by an output-identical linear form. Since `.` never matches "\n", the paper's `.*?` / `.*` steps act per
# line, and within one line:
#   (.*?)(\$)(.*?)(\$)(.*) -> "$\3$"  the whole line, if it has two "$", becomes "$<text between the first two>$"
#   (\\text\{)(.*?)(\})    -> "\2"    same as \\text\{([^}]*)\}; an opener after the line's last "}" never matches
#   (\\boxed\{)(.*)(\})    -> "\2"    same regex, run only up to the line's last "}"
# The shorthand steps (frac, sqrt) are linear as they stand. Replacements are assembled from pattern.split
# (same matches as pattern.sub, without 3.11's per-match template expansion in Python).
# ----------------------------------------------------------------------------------------------------
_DOLLAR_LINE = re.compile(r"(?m)^[^$\n]*\$([^$\n]*)\$.*")  # split -> [text, span, text, span, ..., text]
_UNWRAP_FIRST_BRACE = tuple(
    (opener, re.compile(re.escape(opener) + r"([^}]*)\}")) for opener in ("\\text{", "\\textbf{", "\\overline{")
)
_UNWRAP_BOXED = ("\\boxed{", re.compile(r"\\boxed\{(.*)\}"))
_FRAC_SHORTHAND = re.compile(r"frac([^{])(.)")  # split -> [text, a, b, text, a, b, ..., text]
_SQRT_SHORTHAND = re.compile(r"sqrt([^{])")  # split -> [text, a, text, a, ..., text]


def _unwrap(text: str, opener: str, pattern: re.Pattern) -> str:
    """pattern.sub(r"\1", text) line by line, each line only up to its last "}" (nothing after can match)."""

    def one_line(line: str) -> str:
        last_close = line.rfind("}")
        if last_close < 0 or opener not in line:
            return line
        return "".join(pattern.split(line[: last_close + 1])) + line[last_close + 1 :]

    if opener not in text:
        return text
    if "\n" not in text:
        return one_line(text)
    return "\n".join(one_line(line) for line in text.split("\n"))


def normalize_final_answer(final_answer: str) -> str:
    """Minerva answer normalisation, output-identical to the paper's ``normalize_final_answer``, in linear time."""
    text = final_answer.rpartition("=")[2]  # == split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        text = text.replace(before, after)
    for expression in _REMOVED_EXPRESSIONS:
        text = text.replace(expression, "")

    if "$" in text:
        parts = _DOLLAR_LINE.split(text)
        parts[1::2] = [f"${span}$" for span in parts[1::2]]
        text = "".join(parts)
    for opener, pattern in _UNWRAP_FIRST_BRACE:
        text = _unwrap(text, opener, pattern)
    text = _unwrap(text, *_UNWRAP_BOXED)
    if "frac" in text:  # \fracab -> \frac{a}{b}
        parts = _FRAC_SHORTHAND.split(text)
        parts[1::3] = [f"frac{{{a}}}{{{b}}}" for a, b in zip(parts[1::3], parts[2::3])]
        parts[2::3] = [""] * len(parts[2::3])
        text = "".join(parts)
    if "sqrt" in text:  # \sqrta -> \sqrt{a}
        parts = _SQRT_SHORTHAND.split(text)
        parts[1::2] = [f"sqrt{{{a}}}" for a in parts[1::2]]
        text = "".join(parts)
    text = text.replace("$", "")

    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


_normalize_cached = functools.lru_cache(maxsize=1 << 16)(normalize_final_answer)


def _normalize_ground_truth(ground_truth: str) -> str:
    if len(ground_truth) > _GT_CACHE_MAX_CHARS:
        return normalize_final_answer(ground_truth)
    return _normalize_cached(ground_truth)


# ----------------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------------
def extract_answer(solution_str: str) -> str | None:
    """Raw text after the last ``Answer:`` in the last 300 characters (not normalised), or None."""
    matches = ANSWER_PATTERN.findall(solution_str[-RESPONSE_TAIL_CHARS:])
    return matches[-1] if matches else None


def _last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{`` whose braces balance before the text ends (verl's rule), else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None


def _as_text(value: object) -> str | None:
    """The scorer's view of an input: str as is, bytes decoded, numbers str()-ed, anything else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return str(value)
    return None


# ----------------------------------------------------------------------------------------------------
# The scorer
# ----------------------------------------------------------------------------------------------------
def compute_score(
    data_source: object,
    solution_str: object,
    ground_truth: object,
    extra_info: object = None,
    *,
    boxed_fallback: bool = False,
    use_math_verify: bool = False,
    math_verify_timeout_s: float = 5.0,
    **kwargs: object,
) -> dict:
    """Score one response the DAPO way; verl's custom-reward signature.

    Returns ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (``pred``: the normalised extracted answer,
    ``"[INVALID]"`` if none; with ``boxed_fallback`` possibly the raw boxed content). See the module
    docstring for the modes; ``data_source``, ``extra_info`` and unknown keyword arguments are ignored.
    """
    if kwargs.get("strict_box_verify") or kwargs.get("pause_tokens_index") is not None:
        raise ValueError(
            "dapo.reward.compute_score does not implement verl's strict_box_verify / pause_tokens_index "
            f"(got strict_box_verify={kwargs.get('strict_box_verify')!r}, "
            f"pause_tokens_index={kwargs.get('pause_tokens_index')!r}); remove them from reward_kwargs, or "
            "use boxed_fallback=True for verl's fallback to the last \\boxed{}."
        )
    if use_math_verify and not (isinstance(math_verify_timeout_s, (int, float)) and math_verify_timeout_s > 0):
        raise ValueError(
            f"math_verify_timeout_s must be a positive number of seconds, got {math_verify_timeout_s!r}; "
            "set e.g. math_verify_timeout_s=5 (in verl: reward.custom_reward_function.reward_kwargs)"
        )
    response = _as_text(solution_str)
    truth = _as_text(ground_truth)
    if response is None:
        return {"score": -1.0, "acc": False, "pred": INVALID}

    raw_answer = extract_answer(response)
    pred = _normalize_cached(INVALID if raw_answer is None else raw_answer)
    correct = truth is not None and pred == _normalize_ground_truth(truth)

    if boxed_fallback and pred == INVALID:  # verl 0.9.1: also when "Answer:" normalises to "[INVALID]"
        boxed = _last_boxed_content(response[-BOXED_TAIL_CHARS:])  # the last 100 of the last 300
        if boxed is not None:
            raw_answer = pred = boxed
            correct = truth is not None and boxed == truth  # verl compares the raw strings here

    if use_math_verify and not correct and raw_answer is not None and truth is not None:
        correct = _math_verify_pool().equivalent(truth, raw_answer, math_verify_timeout_s)

    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}


# ----------------------------------------------------------------------------------------------------
# Opt-in math-verify equivalence in killable worker processes
# ----------------------------------------------------------------------------------------------------
_STARTUP_TIMEOUT_S = 60.0

# Runs as `python -c`: imports only math_verify (not this package, so no torch), answers one JSON line per
# request on a private copy of stdout (anything sympy prints goes to stderr), exits when its parent is gone.
_WORKER_SOURCE = r"""
import json, logging, os, sys, threading, time
parent = os.getppid()

def exit_when_orphaned():  # stdin EOF ends an idle worker; this ends a busy one (at the next bytecode)
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)

threading.Thread(target=exit_when_orphaned, daemon=True).start()
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
logging.disable(logging.CRITICAL)
try:
    from math_verify import parse, verify
except BaseException as exc:
    reply.write(json.dumps({"ready": False, "error": repr(exc)}) + "\n"); reply.flush(); sys.exit(1)
reply.write(json.dumps({"ready": True}) + "\n"); reply.flush()

def as_latex(text):
    text = text.strip()
    return text if ("$" in text or "\\(" in text or "\\[" in text) else "$" + text + "$"

for line in sys.stdin:
    try:
        request = json.loads(line)
        gold = parse(as_latex(request["gold"]), parsing_timeout=None)
        pred = parse(as_latex(request["pred"]), parsing_timeout=None)
        answer = {"equivalent": bool(gold and pred and verify(gold, pred, timeout_seconds=None))}
    except Exception as exc:
        answer = {"equivalent": False, "error": repr(exc)[:300]}
    reply.write(json.dumps(answer) + "\n"); reply.flush()
"""


class _Worker:
    """One ``python -c`` math-verify process, spoken to in JSON lines with a deadline on every read."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if isinstance(p, str) and p))
        self.process = subprocess.Popen(  # the parent's sys.path, so it finds what find_spec found here
            [sys.executable, "-c", _WORKER_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=env,
        )
        self._buffer = b""
        self.ready = False

    def _read_line(self, deadline: float) -> dict | None:
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:  # not our protocol: treat like a worker that stopped answering
            return None

    def equivalent(self, gold: str, pred: str, timeout_s: float) -> bool | None:
        """True/False, or None when the worker gave no answer in time or died (it must then be killed)."""
        if not self.ready:
            hello = self._read_line(time.monotonic() + _STARTUP_TIMEOUT_S)
            if not hello or not hello.get("ready"):
                raise RuntimeError(f"math-verify worker failed to start: {hello!r}")
            self.ready = True
        try:
            self.process.stdin.write(json.dumps({"gold": gold, "pred": pred}).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:
            return None
        answer = self._read_line(time.monotonic() + timeout_s)
        return None if answer is None else bool(answer.get("equivalent"))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class _WorkerPool:
    """Up to ``max_workers`` workers shared by all threads; a worker that overruns is killed and replaced."""

    def __init__(self, max_workers: int) -> None:
        self._max_workers = max_workers
        self._idle: list[_Worker] = []
        self._count = 0
        self._available = threading.Condition()

    def equivalent(self, gold: str, pred: str, timeout_s: float) -> bool:
        worker = self._acquire()
        result = None
        try:
            result = worker.equivalent(gold, pred, timeout_s)
        finally:
            if result is None:  # timed out, died, or failed to start: never reuse it
                worker.kill()
                self._release(None)
            else:
                self._release(worker)
        if result is None:
            logger.warning(
                "math-verify gave no answer within %.3g s (worker killed); counted as not equivalent: %.80r",
                timeout_s,
                pred,
            )
            return False
        return result

    def _acquire(self) -> _Worker:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        with self._available:
            while not self._idle and self._count >= self._max_workers:
                if not self._available.wait(timeout=deadline - time.monotonic()):
                    raise TimeoutError("no math-verify worker became free within 60 s")
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker()
        except BaseException:
            self._release(None)
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._available:
            if worker is None:
                self._count -= 1
                if self._count < self._max_workers:  # warm a replacement now, off the caller's clock
                    self._count += 1
                    try:
                        self._idle.append(_Worker())
                    except OSError:
                        self._count -= 1
            else:
                self._idle.append(worker)
            self._available.notify()

    def shutdown(self) -> None:
        with self._available:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for worker in idle:
            worker.kill()


_pool: _WorkerPool | None = None
_pool_pid = 0  # a forked child must not share its parent's workers (their pipes)
_pool_lock = threading.Lock()


def _math_verify_pool() -> _WorkerPool:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            if importlib.util.find_spec("math_verify") is None:
                raise ImportError(
                    "use_math_verify=True needs the math-verify package: pip install 'math-verify>=0.7' "
                    "(or this project's [verify] extra)"
                )
            if _pool is None:
                atexit.register(shutdown_math_verify)
            _pool, _pool_pid = _WorkerPool(max_workers=max(1, min(4, os.cpu_count() or 1))), os.getpid()
        return _pool


def shutdown_math_verify() -> None:
    """Stop the idle math-verify workers (they also die with this process); the next check starts new ones."""
    if _pool is not None and _pool_pid == os.getpid():
        _pool.shutdown()
