"""Files (``/v1/files``): uploads kept on the batches' Redis, in OpenAI's shapes, each
owned by the tenant that uploaded it."""
