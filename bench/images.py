"""What normalising an image part costs: a 4-megapixel JPEG and PNG.

``hordelite.contract.images.normalise`` runs once per image part at submit,
in a worker thread. This generates one photo-like 4-megapixel image
(2309x1732, 4:3: gradients with noise, so neither encoder gets a flat
picture for free), encodes it as JPEG (quality 90) and as PNG, and times
``normalise`` on each: decode, EXIF orientation, RGB, the long side bounded
to 2048 px with LANCZOS, JPEG encode. Prints the p50 and the fastest run in
milliseconds over ``--runs`` (10) after one untimed run, and the JPEG/PNG
ratio of the p50s from the same run. A few seconds.

    .venv/bin/python bench/images.py [--runs N]
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import time

import PIL
from PIL import Image

from hordelite.contract.images import normalise

WIDTH, HEIGHT = 2309, 1732  # 4.0 megapixels


def photo_like() -> Image.Image:
    red = Image.linear_gradient("L").resize((WIDTH, HEIGHT))
    green = Image.effect_noise((WIDTH, HEIGHT), 48)
    blue = Image.radial_gradient("L").resize((WIDTH, HEIGHT))
    return Image.merge("RGB", (red, green, blue))


def encoded(img: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    return out.getvalue()


def time_ms(data: bytes, runs: int) -> list[float]:
    normalise(data)  # untimed: plugin imports, first allocations
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        normalise(data)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    img = photo_like()
    inputs = {
        "JPEG q90": encoded(img, "JPEG", quality=90),
        "PNG": encoded(img, "PNG"),
    }
    print(
        f"Pillow {PIL.__version__}, Python {platform.python_version()}, "
        f"{WIDTH}x{HEIGHT} ({WIDTH * HEIGHT / 1e6:.1f} MP), {args.runs} runs each"
    )
    print(f"{'input':<10} {'bytes':>10} {'p50 ms':>8} {'min ms':>8} {'output bytes':>13}")
    p50 = {}
    for name, data in inputs.items():
        times = time_ms(data, args.runs)
        p50[name] = statistics.median(times)
        out = len(normalise(data).jpeg)
        print(f"{name:<10} {len(data):>10,} {p50[name]:>8.1f} {min(times):>8.1f} {out:>13,}")
    print(f"ratio JPEG/PNG (p50): {p50['JPEG q90'] / p50['PNG']:.2f}")


if __name__ == "__main__":
    main()
