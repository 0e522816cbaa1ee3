"""A synthetic reference clip (10 s, or argv[2] seconds) for the voice runs (tools/gpu/voices-run.sh, long-text.sh):
a 24 kHz 16-bit mono WAV of a gliding harmonic tone with a slow tremolo, written with Python's
wave module only (the GPU machine has no network)."""
import math
import struct
import sys
import wave

rate = 24000
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
with wave.open(sys.argv[1], "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(rate)
    frames = bytearray()
    for i in range(int(rate * seconds)):
        t = i / rate
        f0 = 150 + 30 * math.sin(2 * math.pi * 0.6 * t)
        v = sum(0.3 / k * math.sin(2 * math.pi * f0 * k * t) for k in range(1, 5)) * (0.6 + 0.4 * math.sin(2 * math.pi * 2.1 * t))
        frames += struct.pack("<h", int(max(-1, min(1, v)) * 32767))
    w.writeframes(bytes(frames))
