"""Audio in and out of the model.

* :mod:`.io`: decode any audio file to 44.1 kHz mono float32; write 16-bit WAV.
* :mod:`.streaming`: per-request streaming decode of codes into audio chunks.
* :mod:`.batching`: decode chunks of several streams in one decoder call.
* :mod:`.references`: validate and encode reference voices, content-addressed cache.
* :mod:`.encoders`: float audio to wav / pcm / mp3 / opus / flac bytes, whole or streamed.
"""
