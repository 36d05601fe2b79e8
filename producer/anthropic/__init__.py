"""Anthropic's Messages API as tokenq serves it: request bodies mapped to tokenq
requests (through the chat route's mapping), replies and stream events, errors."""
