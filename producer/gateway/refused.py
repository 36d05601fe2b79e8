"""A request refused at submit for what its model's registered limits refuse
(``shared.limits``), in each API's error shape: a 400 naming the field as that API
calls it, before anything is queued."""

from __future__ import annotations

from producer.openai.errors import ApiError, invalid
from producer.openai.output import PARAM_NAMES as OPENAI_NAMES
from producer.refusals import SAMPLING_FIELDS, Refusal
from producer.responses.objects import PARAM_NAMES as RESPONSES_NAMES
from shared.refusal import RequestRefused

# A refusal names a sampling field by its own name; the native body nests it.
NATIVE_NAMES = {name: f"sampling.{name}" for name in SAMPLING_FIELDS}
# Each API's names for the native fields, by the ``api`` a route submits as.
NAMES = {"native": NATIVE_NAMES, "responses": RESPONSES_NAMES, **OPENAI_NAMES}


def refused(e: RequestRefused, api: str) -> ApiError:
    """The 400 for ``e`` on the ``api`` route (``native``, ``chat``, ``text``,
    ``embeddings``, ``responses``)."""
    refusal = Refusal.of(e.refusal)
    return invalid(refusal.message, refusal.param_in(NAMES.get(api, {})), refusal.code)
