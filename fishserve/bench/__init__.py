"""`fishserve bench`: an async HTTP load generator for text-to-speech servers.

It measures any server that speaks Fish Speech's `POST /v1/tts` or OpenAI's
`POST /v1/audio/speech`, so peers can be measured with the same tool. Modules, in the order a
run uses them: `workload` (texts and request bodies), `client` (one timed request),
`memory` (GPU memory polling), `load` (concurrency sweep / Poisson arrivals), `stats`
(per-level summary), `report` and `plots` (JSON, markdown, PNG), `run` (the whole command).
"""
