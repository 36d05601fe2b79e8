"""The tokenq worker: claims requests from Redis into a continuous-batching engine."""
