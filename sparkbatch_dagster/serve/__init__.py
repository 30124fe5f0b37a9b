"""``sparkbatch serve-batch``'s service: OpenAI's Files and Batches APIs and Anthropic's Message
Batches over HTTP, each batch a job run by a ``sparkbatch run-batch`` child. ``cli.serve_batch``
reads the arguments and starts the server on :func:`.app.make_app`.

Modules:

- :mod:`.app`: the FastAPI app: the routers, the errors in each API's shape, the OpenAPI document;
- :mod:`.openai_files`: OpenAI's Files routes;
- :mod:`.openai_batches`: OpenAI's Batches routes;
- :mod:`.anthropic_batches`: Anthropic's Message Batches routes;
- :mod:`.health`: ``GET /healthz``, liveness;
- :mod:`.paging`: what OpenAI's routes share: a list's cursor page, the OpenAPI links;
- :mod:`.openai_models`: OpenAI's request and response models;
- :mod:`.anthropic_models`: Anthropic's request and response models;
- :mod:`.anthropic_create`: a Message Batch's requests checked one at a time from the body's bytes;
- :mod:`.guard`: the Host, Origin, API key and body-size checks before any route;
- :mod:`.worker`: the worker that validates and runs the batches;
- :mod:`.store`: the files and batches on disk;
- :mod:`.record`: a batch as the store keeps it, one typed record for both APIs;
- :mod:`.validate`: a batch input file's check while it is ``validating``;
- :mod:`.results`: the error lines of requests that never ran (expired, cancelled);
- :mod:`.ending`: what a batch holds once it ends (result files, counts, usage).

May import: ``definitions`` and every room below it; never ``cli`` (which imports it) or ``review``.
"""
