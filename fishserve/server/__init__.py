"""HTTP server: Fish Speech's /v1/tts, OpenAI's /v1/audio/speech, voices, health, metrics."""
