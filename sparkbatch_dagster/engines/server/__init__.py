"""The server backend: an OpenAI-compatible client of ``vllm serve`` (running, or started here).

Modules: :mod:`.vllm_server` (the engine), :mod:`.server_bodies` (one request's JSON body),
:mod:`.token_prompts` (prompts sent as token ids), :mod:`.prompt_groups` (several rows in one
completions request), :mod:`.reasoning_server` (thinking through the server), :mod:`.endpoints`
(the servers' URLs, health and served model), :mod:`.replicas` (which replica gets the next
request), :mod:`.handoff` (coroutines handed to the client's event loop), :mod:`.server_process`
(``vllm serve`` started and stopped here) and :mod:`.multinode` (one engine over several machines).

May import: ``errors``, ``spec``, ``home``; ``engines`` base modules, :mod:`..platform`,
:mod:`..answers`. Not :mod:`..offline`.
"""
