"""OpenAI's Responses API on tokenq: a response is a tokenq request.

Its body is read into a chat request (``plan``), so tools, strict schemas and reasoning
go exactly as on the chat route; the stored response (``record``) lives in the request's
own hash and expires with it; the streamed events and the response object are a
deterministic function of that record and the request's stream entries (``events``), so
any gateway serves any response, and a stream resumes after any sequence number.
"""
