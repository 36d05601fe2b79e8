"""Constrained decoding: grammars compiled from guided_json / guided_regex (with
xgrammar), cached by their source, and one matcher per sequence.

Grammars compile on a background thread, never in the step loop: a large new schema
takes a while, and the running streams must not wait for it. A guided request whose
grammar is still compiling waits in ``CompilingRequests``, outside the scheduler,
and joins once the grammar is ready; a cached grammar joins at once.

A matcher follows the tokens its sequence generates; the sampler asks it for the
mask of tokens that may come next. A resumed request replays the tokens it already
has into a fresh matcher, so it continues where it was.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import cached_property
from typing import Any

import orjson
import torch

from shared.guided import schema_key
from shared.models import GUIDES, FinishReason, SamplingParams
from shared.refusal import RefusalCode, RequestRefused
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest

log = logging.getLogger(__name__)

# xgrammar prefixes its errors with a timestamp and a C++ source location.
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


# The one command that gives a CPU worker structured outputs (xgrammar's wheel asks for
# triton, a GPU compiler a CPU worker does not need; see pyproject.toml).
GRAMMAR_INSTALL = "pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2"


def grammar_backend_problem() -> str | None:
    """Why this worker cannot serve structured outputs (its grammar backend does not
    import), or None when it can."""
    try:
        import xgrammar  # noqa: F401
    except Exception as e:  # ImportError, or a broken build's own error
        return (
            f"xgrammar cannot be imported ({type(e).__name__}: {e}); install it: {GRAMMAR_INSTALL}"
        )
    return None


class GrammarError(RequestRefused):
    """A guided_json / guided_regex that cannot be compiled into a grammar; ``param``
    is the guided field at fault (None when the worker serves none)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(RefusalCode.INVALID_VALUE, param, message)


class GrammarState:
    """One sequence's matcher (what the sampler's ``TokenMask`` protocol asks for)."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, index)

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it."""
        if self.matcher.is_terminated():
            return False
        return bool(self.matcher.accept_token(token_id))

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted (speculative decoding checks drafts)."""
        if num_tokens:
            self.matcher.rollback(num_tokens)

    @property
    def terminated(self) -> bool:
        """The output is complete: only a stop token could come next, and it came."""
        return bool(self.matcher.is_terminated())


class Grammars:
    """Compiles grammars on ``num_compile_threads`` background threads (one large
    schema holds one of them, not the others) and caches them (the most recently used
    ``max_num_cached``, failures included); thread-safe."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        max_threads: int = 1,
        max_num_cached: int = 256,
        num_compile_threads: int = 4,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.max_threads = max_threads
        self.max_num_cached = max_num_cached
        self._lock = threading.Lock()
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(num_compile_threads, thread_name_prefix="grammar-compile")
        self._compiled: OrderedDict[str, Future[Any]] = OrderedDict()

    def give_up(
        self, params: SamplingParams, future: Future[Any], error: GrammarError | None
    ) -> None:
        """No request waits for ``future`` any more: cancel it if it has not started
        (forgotten, so a later request compiles it afresh). With ``error`` (it ran out
        of time, and would again) later requests for the same grammar are refused at
        once with it; else a compile under way is kept for them."""
        source, cancelled = _source(params), future.cancel()
        with self._lock:
            if self._compiled.get(source) is not future:
                return
            if cancelled:
                del self._compiled[source]
            elif error is not None:
                failed: Future[Any] = Future()
                failed.set_exception(error)
                self._compiled[source] = failed

    @property
    def _compiler(self) -> Any:
        with self._compiler_lock:  # the first compile threads build it once
            return self._built_compiler

    @cached_property
    def _built_compiler(self) -> Any:
        problem = grammar_backend_problem()
        if problem is not None:
            raise GrammarError(f"structured outputs are not served by this worker: {problem}")
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )
        return xgr.GrammarCompiler(info, max_threads=self.max_threads, cache_enabled=False)

    def compile(self, params: SamplingParams) -> Future[Any]:
        """The grammar for ``params``, compiling in the background (done at once when
        cached); its ``result()`` raises ``GrammarError`` when it cannot compile."""
        source = _source(params)
        with self._lock:
            future = self._compiled.get(source)
            if future is None:
                future = self._pool.submit(self._compile, params)
                self._compiled[source] = future
                if len(self._compiled) > self.max_num_cached:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(source)
        return future

    def follow(self, compiled: Any, output_token_ids: Iterable[int] = ()) -> GrammarState:
        """A fresh matcher over ``compiled`` that has followed ``output_token_ids``."""
        import xgrammar as xgr

        state = GrammarState(xgr.GrammarMatcher(compiled))
        for token_id in output_token_ids:
            if not state.accept(token_id):
                break
        return state

    def _compile(self, params: SamplingParams) -> Any:
        compiler = self._compiler
        try:
            if params.guided_json is not None:
                # Unsorted: xgrammar writes properties in the order the schema declares.
                schema = orjson.dumps(params.guided_json).decode()
                return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=False)
            if params.guided_structural_tag is not None:
                return compiler.compile_structural_tag(
                    orjson.dumps(params.guided_structural_tag).decode()
                )
            return compiler.compile_regex(params.guided_regex)
        except RuntimeError as e:
            raise GrammarError(_describe(params, e), _guide(params)) from e


class CompilingRequests:
    """Guided requests whose grammar is compiling; they join the scheduler when it is
    ready, or end: with an error (it cannot compile), aborted, or past their deadline."""

    def __init__(self, grammars: Grammars, timeout_s: float = 10.0) -> None:
        self.grammars = grammars
        self.timeout_s = timeout_s
        self._waiting: dict[str, tuple[EngineRequest, Future[Any]]] = {}
        self._since: dict[str, float] = {}  # when each began waiting (monotonic)
        self._ended: list[RequestOutput] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting

    def add(self, req: EngineRequest) -> bool:
        """Start ``req``'s grammar; True when it is ready now (``req.grammar`` is set),
        False when ``req`` waits here. Raises ``GrammarError`` for a grammar already
        known not to compile."""
        future = self.grammars.compile(req.sampling)
        if future.done():
            req.grammar = self.grammars.follow(future.result(), req.output_token_ids)
            return True
        self._waiting[req.request_id] = (req, future)
        self._since[req.request_id] = time.monotonic()
        return False

    def abort(
        self, request_id: str, reason: FinishReason, error: GrammarError | None = None
    ) -> bool:
        """End a waiting request at the next ``take``; False when it is not here. A
        compile no request waits for any more is given up."""
        entry = self._waiting.pop(request_id, None)
        self._since.pop(request_id, None)
        if entry is None:
            return False
        req, future = entry
        self._ended.append(_ended(req, reason, error))
        if not future.done() and all(f is not future for _, f in self._waiting.values()):
            self.grammars.give_up(req.sampling, future, error)
        return True

    def _time_out(self, now_s: float) -> None:
        """End the requests whose grammar has compiled for longer than the limit."""
        for request_id, (req, future) in list(self._waiting.items()):
            if not future.done() and now_s - self._since[request_id] > self.timeout_s:
                field = _guide(req.sampling)
                error = GrammarError(
                    f"{field}: its grammar did not compile within the worker's limit of "
                    f"{self.timeout_s:g} s; simplify it (fewer anyOf branches, smaller enums)",
                    field,
                )
                self.abort(request_id, FinishReason.ERROR, error)

    def take(self, now_unix_s: float) -> tuple[list[EngineRequest], list[RequestOutput]]:
        """The requests whose grammar is ready (matcher set), and the outputs that end
        the others that cannot wait any longer."""
        for request_id, (req, _) in list(self._waiting.items()):
            if req.deadline_unix_s is not None and req.deadline_unix_s <= now_unix_s:
                self.abort(request_id, FinishReason.TIMEOUT)
        self._time_out(time.monotonic())
        ready = [req for req, future in self._waiting.values() if future.done()]
        for req in ready:
            self._finish_compile(req)
        ended, self._ended = self._ended, []
        return [req for req in ready if req.grammar is not None], ended

    def wait(self, timeout_s: float) -> None:
        """Block until a compile finishes or ``timeout_s`` passes (at once when none
        is running): for a loop that has nothing else to do."""
        futures = [future for _, future in self._waiting.values()]
        if futures:
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def _finish_compile(self, req: EngineRequest) -> None:
        _, future = self._waiting.pop(req.request_id)
        self._since.pop(req.request_id, None)
        try:
            req.grammar = self.grammars.follow(future.result(), req.output_token_ids)
        except GrammarError as e:
            self._ended.append(_ended(req, FinishReason.ERROR, e))
        except Exception as e:  # the grammar backend itself failed: this request's end
            log.warning("grammar for request %s failed: %r", req.request_id, e)
            error = f"internal error: its grammar could not be built: {e!r}"
            self._ended.append(_ended(req, FinishReason.ERROR, error))


def _ended(
    req: EngineRequest, reason: FinishReason, error: str | GrammarError | None = None
) -> RequestOutput:
    """``req``'s end; a ``GrammarError`` ends it refused (its text and its refusal)."""
    num_output = len(req.output_token_ids)
    num_prompt = len(req.prompt_token_ids)
    refusal = error.refusal if isinstance(error, GrammarError) else None
    text = None if error is None else str(error)
    return RequestOutput(
        req.request_id,
        num_output,
        [],
        "",
        reason,
        None,
        num_prompt,
        num_output,
        text,
        refusal=refusal,
    )


def _source(params: SamplingParams) -> str:
    """The cache key of ``params``' grammar."""
    if params.guided_json is not None:
        return "json:" + schema_key(params.guided_json)
    if params.guided_regex is not None:
        return "regex:" + params.guided_regex
    if params.guided_structural_tag is not None:
        return "tag:" + schema_key(params.guided_structural_tag)
    raise GrammarError("the request has no guided_json, guided_regex or guided_structural_tag")


def _guide(params: SamplingParams) -> str:
    """The guided field ``params`` sets."""
    return next(name for name in GUIDES if getattr(params, name) is not None)


def _describe(params: SamplingParams, error: RuntimeError) -> str:
    field = _guide(params)
    detail = _CPP_PREFIX.sub("", str(error).strip().splitlines()[0])
    return f"{field}: cannot be used for constrained decoding: {detail}"
