"""The OpenAI API translated to tokenq and back, for the gateway's routes and for batch
lines alike: request bodies (``schemas``) to GenerationRequests (``requests``,
``embeddings``), tools (``tools``), and stream events to OpenAI answers (``output``).
Nothing here does HTTP or needs a web framework."""
