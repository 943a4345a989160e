"""contract/images.py: an image part checked and normalised to a stored JPEG.

Every image is made here with Pillow, in memory.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Callable

import pytest
from PIL import Image

from hordelite.contract import image_normalise as images
from hordelite.contract.image_normalise import ImageRefused, NormalisedImage, normalise
from hordelite.contract.limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE
from hordelite.errors import HordeliteError

RED = (255, 0, 0)
BLUE = (0, 0, 255)
WHITE = (255, 255, 255)


def _encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    return out.getvalue()


def _decoded(result: NormalisedImage) -> Image.Image:
    img = Image.open(io.BytesIO(result.jpeg))
    img.load()
    return img


def _near(pixel: object, colour: tuple[int, int, int], tolerance: int = 40) -> bool:
    assert isinstance(pixel, tuple)
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, colour, strict=True))


def _refusal(data: bytes) -> ImageRefused:
    with pytest.raises(ImageRefused) as info:
        normalise(data)
    # The caller names the message part; the message names no path.
    assert "/" not in info.value.message
    assert "\\" not in info.value.message
    return info.value


def _png() -> bytes:
    return _encode(Image.new("RGB", (40, 30), RED), "PNG")


def _webp() -> bytes:
    return _encode(Image.new("RGB", (40, 30), RED), "WEBP", quality=95)


def _jpeg() -> bytes:
    return _encode(Image.new("RGB", (40, 30), RED), "JPEG")


def _animated_gif() -> bytes:
    frames = [Image.new("RGB", (40, 30), RED), Image.new("RGB", (40, 30), BLUE)]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)


def _cmyk_jpeg() -> bytes:
    return _encode(Image.new("CMYK", (40, 30), (0, 255, 255, 0)), "JPEG")


def _png_16_bit() -> bytes:
    return _encode(Image.new("I;16", (40, 30), 0x8000), "PNG")


def _palette_with_transparency() -> bytes:
    img = Image.new("P", (40, 30), 1)
    img.putpalette([0, 255, 0, *RED])  # index 0 green, transparent; 1 red
    img.paste(0, (0, 0, 20, 30))
    return _encode(img, "PNG", transparency=0)


def _rgba() -> bytes:
    img = Image.new("RGBA", (40, 30), (*BLUE, 255))
    img.paste((0, 255, 0, 0), (0, 0, 20, 30))  # green, fully transparent
    return _encode(img, "PNG")


SOURCES: dict[str, tuple[Callable[[], bytes], str]] = {
    "png": (_png, "PNG"),
    "webp": (_webp, "WEBP"),
    "jpeg": (_jpeg, "JPEG"),
    "animated gif": (_animated_gif, "GIF"),
    "cmyk jpeg": (_cmyk_jpeg, "JPEG"),
    "16-bit png": (_png_16_bit, "PNG"),
    "palette with transparency": (_palette_with_transparency, "PNG"),
    "rgba": (_rgba, "PNG"),
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_accepted_image_becomes_an_rgb_jpeg_without_metadata(name: str) -> None:
    make, source_format = SOURCES[name]
    result = normalise(make())
    img = _decoded(result)
    assert img.format == "JPEG"
    assert img.mode == "RGB"
    assert img.size == (result.width, result.height) == (40, 30)
    assert result.source_format == source_format
    assert "exif" not in img.info
    assert not img.getexif()


@pytest.mark.parametrize("name", ["png", "webp", "jpeg", "cmyk jpeg"])
def test_colours_survive(name: str) -> None:
    img = _decoded(normalise(SOURCES[name][0]()))
    assert _near(img.getpixel((20, 15)), RED)


def test_an_animated_gif_keeps_its_first_frame() -> None:
    img = _decoded(normalise(_animated_gif()))
    assert _near(img.getpixel((20, 15)), RED)


def test_a_16_bit_image_is_scaled_to_8_bits_not_clipped() -> None:
    # 0x8000 of 0xFFFF is mid-grey; a clipping conversion would give white.
    img = _decoded(normalise(_png_16_bit()))
    assert _near(img.getpixel((20, 15)), (128, 128, 128), tolerance=4)


@pytest.mark.parametrize("name", ["palette with transparency", "rgba"])
def test_transparency_is_flattened_on_white(name: str) -> None:
    img = _decoded(normalise(SOURCES[name][0]()))
    assert _near(img.getpixel((5, 15)), WHITE)
    assert not _near(img.getpixel((35, 15)), WHITE)


def test_exif_orientation_is_applied_and_the_exif_dropped() -> None:
    img = Image.new("RGB", (40, 20), BLUE)
    img.paste(RED, (0, 0, 20, 20))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: shown rotated 90 degrees clockwise
    result = normalise(_encode(img, "JPEG", exif=exif))
    out = _decoded(result)
    assert (result.width, result.height) == out.size == (20, 40)
    # Rotated clockwise, the left half is on top.
    assert _near(out.getpixel((10, 5)), RED)
    assert _near(out.getpixel((10, 35)), BLUE)
    assert not out.getexif()


@pytest.mark.parametrize(
    ("fmt", "size", "expected"),
    [
        ("PNG", (3000, 1000), (MAX_IMAGE_SIDE, 683)),
        ("PNG", (1000, 3000), (683, MAX_IMAGE_SIDE)),
        # A JPEG over twice the bound is decoded at a reduced scale first.
        ("JPEG", (4200, 1000), (MAX_IMAGE_SIDE, 488)),
        ("PNG", (MAX_IMAGE_SIDE, 10), (MAX_IMAGE_SIDE, 10)),
    ],
)
def test_the_long_side_is_bounded_keeping_the_aspect(
    fmt: str, size: tuple[int, int], expected: tuple[int, int]
) -> None:
    result = normalise(_encode(Image.new("RGB", size, RED), fmt))
    assert (result.width, result.height) == _decoded(result).size == expected
    assert _near(_decoded(result).getpixel((5, 5)), RED)


def _png_declaring(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR is patched to declare another size."""
    data = bytearray(_encode(Image.new("RGB", (1, 1), RED), "PNG"))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17]))
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


@pytest.mark.parametrize("size", [(100_000, 100_000), (8000, 8000)])
def test_a_decompression_bomb_is_refused_from_its_header(size: tuple[int, int]) -> None:
    # The file holds one pixel: had it been decoded, it would be refused as
    # truncated, so too_many_pixels shows no pixel was decoded.
    data = _png_declaring(*size)
    assert len(data) < 100
    assert _refusal(data).reason == "too_many_pixels"


def test_the_pixel_cap_holds_where_pillow_only_warns() -> None:
    # Past the cap but under twice it, Pillow warns; a deployment that
    # ignores its warnings is still refused by the module's own check.
    side = int(MAX_IMAGE_PIXELS**0.5) + 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        refusal = _refusal(_png_declaring(side, side))
    assert refusal.reason == "too_many_pixels"
    assert f"{side}x{side}" in refusal.message


def test_pillows_guard_is_the_same_cap() -> None:
    assert Image.MAX_IMAGE_PIXELS == MAX_IMAGE_PIXELS


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_a_truncated_image_is_refused(fmt: str) -> None:
    # Noise, so the encoded file is not one short run of bytes.
    img = Image.frombytes("RGB", (64, 64), bytes(range(256)) * 48)
    data = _encode(img, fmt)
    assert _refusal(data[: len(data) // 2]).reason == "truncated"


def test_an_accepted_signature_with_a_broken_header_is_refused_as_corrupt() -> None:
    assert _refusal(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).reason == "truncated"


@pytest.mark.parametrize(
    "data", [b"just some text, named photo.png", b"", b"<svg xmlns='x'></svg>", b"%PDF-1.7\n"]
)
def test_a_non_image_is_refused(data: bytes) -> None:
    assert _refusal(data).reason == "not_an_image"


@pytest.mark.parametrize(("fmt", "name"), [("BMP", "BMP"), ("TIFF", "TIFF")])
def test_an_image_of_another_format_is_refused_naming_it(fmt: str, name: str) -> None:
    refusal = _refusal(_encode(Image.new("RGB", (8, 8), RED), fmt))
    assert refusal.reason == "format"
    assert name in refusal.message


def test_an_input_over_the_byte_cap_is_refused_before_it_is_opened() -> None:
    # A valid PNG padded past the cap: the size alone refuses it.
    data = _png() + b"\x00" * MAX_IMAGE_BYTES
    assert _refusal(data).reason == "too_large"


def test_the_refusal_is_a_hordelite_error() -> None:
    assert issubclass(ImageRefused, HordeliteError)


def test_a_data_url_round_trips() -> None:
    jpeg = normalise(_png()).jpeg
    url = images.data_url(jpeg)
    assert url.startswith("data:image/jpeg;base64,")
    assert images.parse_data_url(url) == jpeg


def test_a_data_url_of_any_image_type_is_read() -> None:
    png = _png()
    url = "DATA:image/png;name=x.png;base64," + images.data_url(png).split(",", 1)[1]
    assert images.parse_data_url(url) == png


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://example.com/cat.png", "data_url"),
        ("data:image/png;base64", "data_url"),
        ("data:image/png,rawbytes", "data_url"),
        ("data:image/png;base64,not base64!", "data_url"),
        ("data:image/png;base64,aGk", "data_url"),  # missing padding
        ("data:text/plain;base64,aGk=", "media_type"),
        ("data:;base64,aGk=", "media_type"),
        ("data:image/png;base64," + "A" * (MAX_IMAGE_BYTES // 3 * 4 + 8), "too_large"),
    ],
)
def test_a_malformed_data_url_is_refused(url: str, reason: str) -> None:
    with pytest.raises(ImageRefused) as info:
        images.parse_data_url(url)
    assert info.value.reason == reason


@pytest.mark.parametrize("jpeg_bytes", [0, 1, 2, 3, 1000, 1001])
def test_the_inlined_size_is_known_from_the_references_alone(jpeg_bytes: int) -> None:
    """The offload decision at pop reads no image: the size it works out
    from the references is the size of the messages with the images inlined."""
    import json

    from hordelite.contract.image_normalise import data_url
    from hordelite.horde.request_images import _inlined_bytes

    def messages(url: str) -> list[dict[str, object]]:
        return [
            {"role": "system", "content": "Be brief. ✓"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                ],
            },
        ]

    reference = f"hordelite-blob:r-0/{jpeg_bytes}"
    inlined = messages(data_url(b"\xff" * jpeg_bytes))
    expected = len(json.dumps(inlined, ensure_ascii=False, separators=(",", ":")).encode())
    assert _inlined_bytes(messages(reference)) == expected
