"""The HTTP gateway: OpenAI-compatible and native routes over a tokenq queue.

Kept free of imports so that ``tokenq`` commands other than ``gateway`` do not load the
web stack: the app is ``producer.gateway.app.create_app``, the command
``producer.gateway.cli.gateway``.
"""
