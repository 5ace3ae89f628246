"""A stand-in TTS server: every POST streams 10 s of silent pcm in 0.5 s pieces over ~6 s."""
import asyncio
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse, PlainTextResponse
from starlette.routing import Route

async def tts(request):
    await request.body()
    async def body():
        await asyncio.sleep(0.2)
        for _ in range(20):
            yield b"\x00" * 44100  # 0.5 s of 16-bit mono at 44.1 kHz
            await asyncio.sleep(0.3)
    return StreamingResponse(body(), media_type="audio/pcm", headers={"X-Sample-Rate": "44100"})

async def health(request):
    return JSONResponse({"status": "ok"})

async def metrics(request):
    return PlainTextResponse("")

app = Starlette(routes=[Route("/v1/tts", tts, methods=["POST"]), Route("/health", health), Route("/metrics", metrics)])
