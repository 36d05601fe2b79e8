"""The OpenAI API translated to tokenq and back, for the gateway's routes and for batch
lines alike (and for any other API shaped like it). Nothing here does HTTP or needs a
web framework.

Requests: ``schemas`` (the bodies), ``requests`` and ``embeddings`` (bodies to
GenerationRequests), ``tools`` (tools and tool_choice: the fallback prompt, or the
model's own template and format), ``tool_grammar`` (the grammar that forces calls).
Answers: ``reply`` (a reply read as it streams: reasoning, text and tool calls apart,
by ``reasoning`` and ``tool_formats``), ``output`` (stream events to chunks and whole
answers), ``answers`` and ``responses`` (usage, the answer models), ``errors``.
"""
