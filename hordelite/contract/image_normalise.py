"""An image part's bytes checked and normalised to the JPEG the horde stores.

Pure: bytes in, bytes out, no I/O and no event loop. Decoding takes tens of
milliseconds, so the submit path runs ``normalise`` in a worker thread.

Every refusal is an ``ImageRefused`` with a short machine ``reason`` and a
human ``message`` that names no path and no part: the caller knows which
part of which message it was (``messages[2].content[1].image_url``) and
answers 400 naming it.

The checks come in the order of their cost: the byte count before anything
is parsed, the format from the first bytes before a parser runs, the pixel
count the header declares before a pixel is decoded, then the full decode.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import struct
from dataclasses import dataclass
from typing import Final

from PIL import Image, ImageOps, UnidentifiedImageError

from hordelite.contract.limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE
from hordelite.errors import HordeliteError

# The formats a client may send: what browsers and vision clients produce.
# An animated GIF, WebP or PNG keeps its first frame.
ACCEPTED_FORMATS: Final = ("JPEG", "PNG", "WEBP", "GIF")
_FORMAT_NAMES: Final = "JPEG, PNG, WebP or GIF"
# JPEG at this quality is visually lossless for a vision model's input and
# about a fifth of the PNG's size.
JPEG_QUALITY: Final = 90
# Transparency is flattened on white, as a viewer shows a transparent
# image on a page.
_BACKGROUND: Final = (255, 255, 255)
# Pillow identifies a format from this many leading bytes.
_PREFIX_BYTES: Final = 16
_DATA_URL_BASE64: Final = ";base64"
# base64 takes 4 characters for every 3 bytes.
_MAX_BASE64_CHARS: Final = 4 * math.ceil(MAX_IMAGE_BYTES / 3)

# Pillow's own guard, set to the same cap: Image.open raises
# DecompressionBombError past twice the cap (and warns past the cap) even
# where a plugin sizes an image before this module can look at it. Every
# image it would warn about is refused below by the same cap.
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS


class ImageRefused(HordeliteError):
    """An image the horde does not store; ``message`` names no path."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(f"{reason}: {message}")


@dataclass(frozen=True, slots=True)
class NormalisedImage:
    """The JPEG to store, its size, and the format the client sent."""

    jpeg: bytes
    width: int
    height: int
    source_format: str


def normalise(data: bytes) -> NormalisedImage:
    """Check ``data`` and return it as an RGB JPEG with a bounded long side.

    EXIF orientation is applied and no metadata is kept: the stored image
    looks as the client's viewer showed it and carries no location.
    """
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRefused(
            "too_large", f"The image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB."
        )
    img = _open(data)
    source_format = img.format or ""
    width, height = img.size
    if width * height > MAX_IMAGE_PIXELS:
        raise _too_many_pixels(width, height)
    target = _bounded(width, height)
    if target != (width, height):
        # A JPEG is then decoded at 1/2, 1/4 or 1/8 scale where that still
        # covers the target: less memory and time, same result after resizing.
        img.draft(None, target)
    try:
        img.load()
        img = ImageOps.exif_transpose(img)
        rgb = _to_rgb(img)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _too_many_pixels(width, height) from exc
    except MemoryError:
        raise
    except Exception as exc:
        # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError,
        # struct.error and others on a broken file: each is the client's file.
        raise ImageRefused("truncated", "The image is truncated or corrupt.") from exc
    bounded = _bounded(*rgb.size)
    if bounded != rgb.size:
        rgb = rgb.resize(bounded, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=JPEG_QUALITY)
    return NormalisedImage(out.getvalue(), rgb.width, rgb.height, source_format)


DATA_URL_PREFIX = "data:image/jpeg;base64,"


def data_url(jpeg: bytes) -> str:
    """The base64 data URL of a stored JPEG."""
    return DATA_URL_PREFIX + base64.b64encode(jpeg).decode("ascii")


def data_url_bytes(url: str) -> int:
    """The bytes a base64 data URL holds at most, known from its length
    before anything is decoded (3 bytes per 4 characters, padding counted)."""
    return (len(url) - url.find(",") - 1) * 3 // 4


def parse_data_url(url: str) -> bytes:
    """The bytes of a base64 ``data:image/...`` URL.

    The media type must be an image type, but it is not trusted: ``normalise``
    takes the format from the bytes.
    """
    if url[:5].lower() != "data:" or "," not in url:
        raise ImageRefused("data_url", "The image URL is not a data URL.")
    header, payload = url[5:].split(",", 1)
    if not header.lower().endswith(_DATA_URL_BASE64):
        raise ImageRefused("data_url", "The image data URL is not base64.")
    media_type = header[: -len(_DATA_URL_BASE64)].split(";", 1)[0].strip().lower()
    if not media_type.startswith("image/"):
        raise ImageRefused("media_type", "The data URL's media type is not an image type.")
    if len(payload) > _MAX_BASE64_CHARS:
        raise ImageRefused(
            "too_large", f"The image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB."
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageRefused("data_url", "The image data URL is not valid base64.") from exc


def _open(data: bytes) -> Image.Image:
    """Read the header of an accepted format; no pixel is decoded."""
    try:
        return Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRefused("too_many_pixels", "The image declares too many pixels.") from exc
    except UnidentifiedImageError:
        pass
    except MemoryError:
        raise
    except Exception as exc:
        raise ImageRefused("truncated", "The image is truncated or corrupt.") from exc
    named = _identify(data[:_PREFIX_BYTES])
    if named is None:
        raise ImageRefused("not_an_image", f"The data is not an image ({_FORMAT_NAMES}).")
    if named in ACCEPTED_FORMATS:
        # Its first bytes are an accepted format's but its header is not.
        raise ImageRefused("truncated", "The image is truncated or corrupt.")
    raise ImageRefused("format", f"{named} images are not accepted: send {_FORMAT_NAMES}.")


def _identify(prefix: bytes) -> str | None:
    """The format whose signature the first bytes carry, parsing nothing.

    Only names the format of a refusal: only the accepted formats' parsers
    ever read a client's header.
    """
    Image.init()
    for name in Image.ID:
        accept = Image.OPEN[name][1]
        try:
            if accept is not None and accept(prefix):
                return name
        except (IndexError, TypeError, SyntaxError, struct.error):
            # A signature check reading past a short prefix: as Image.open,
            # that format is not it.
            continue
    return None


def _too_many_pixels(width: int, height: int) -> ImageRefused:
    return ImageRefused(
        "too_many_pixels",
        f"The image has {width}x{height} pixels, more than {MAX_IMAGE_PIXELS:,}.",
    )


def _bounded(width: int, height: int) -> tuple[int, int]:
    """The size with the long side at most MAX_IMAGE_SIDE, the aspect kept."""
    long_side = max(width, height)
    if long_side <= MAX_IMAGE_SIDE:
        return width, height
    scale = MAX_IMAGE_SIDE / long_side
    return max(1, round(width * scale)), max(1, round(height * scale))


def _to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB from any mode a decoder gives."""
    if img.mode.startswith("I"):
        # 16-bit grayscale (PNG gives I;16, some decoders I): the high byte
        # is the 8-bit value; converting directly would clip at 255.
        img = img.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info
    if not has_alpha:
        return img.convert("RGB")
    rgba = img.convert("RGBA")
    flat = Image.new("RGB", rgba.size, _BACKGROUND)
    flat.paste(rgba, mask=rgba.getchannel("A"))
    return flat
