"""Secrets in an artifact's bytes, whatever their encoding: each declared secret is looked
for as UTF-8, UTF-16 and UTF-32 (LE and BE) and latin-1 bytes and masked in place; an
artifact floom cannot look inside (compressed, archived or encrypted: told by its first
bytes, a zip also by the directory at its end, a PDF by the compressed streams it holds) is
marked unscannable and served only to keys that may run workers."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from floom.errors import Forbidden

if TYPE_CHECKING:
    from floom.services.access.principal import Principal

ENCODINGS: Final = ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "latin-1")
# (first bytes, what it is, the content type floom records for it)
_MAGIC: Final = (
    (b"\x1f\x8b", "gzip", "application/gzip"),
    (b"PK\x03\x04", "zip", "application/zip"),
    (b"PK\x05\x06", "zip", "application/zip"),
    (b"PK\x07\x08", "zip", "application/zip"),
    (b"\xfd7zXZ\x00", "xz", "application/x-xz"),
    (b"(\xb5/\xfd", "zstd", "application/zstd"),
    (b"7z\xbc\xaf\x27\x1c", "7z", "application/x-7z-compressed"),
    (b"Rar!\x1a\x07", "rar", "application/vnd.rar"),
    (b"\x04\x22\x4d\x18", "lz4", "application/x-lz4"),
    (b"LZIP", "lzip", "application/x-lzip"),
    (b"\x1f\x9d", "compress", "application/x-compress"),
    (b"age-encryption.org/", "age-encrypted", "application/x-age-encrypted"),
    (b"-----BEGIN PGP MESSAGE", "PGP-encrypted", "application/pgp-encrypted"),
)
_ZLIB_HEADERS: Final = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")
"""A zlib stream's first two bytes (deflate, 32 KiB window, each compression level)."""
_ZIP_END: Final = b"PK\x05\x06"
"""A zip's end of central directory record: zip readers find the archive from the end, so a
zip behind other bytes (a self-extracting one, or one prefixed on purpose) still opens."""
_ZIP_END_SPAN: Final = 22 + 0xFFFF  # the record and the longest comment after it
_PDF_FILTERS: Final = (
    b"/FlateDecode",
    b"/LZWDecode",
    b"/RunLengthDecode",
    b"/ASCII85Decode",
    b"/ASCIIHexDecode",
    b"/Crypt",
    b"/Encrypt",
    b"/Fl ",
    b"/Fl/",
    b"/Fl]",
    b"/ObjStm",
)
"""What makes a PDF's text unreadable as bytes: its streams' compression and encoding
filters (and their short names), object streams (always compressed) and encryption."""
UNSCANNABLE_TYPES: Final = frozenset(content_type for _, _, content_type in _MAGIC) | {
    "application/x-bzip2",
    "application/zlib",
    "application/pdf",
}
SCOPE_FOR_UNSCANNABLE: Final = "run"


def unscannable_kind(data: bytes) -> tuple[str, str] | None:
    """(what it is, its content type) when `data` is a format floom cannot scan for secrets
    (its contents are compressed or encrypted), else None."""
    for magic, kind, content_type in _MAGIC:
        if data.startswith(magic):
            return kind, content_type
    if data.startswith(b"BZh") and data[3:4].isdigit() and data[3:4] != b"0":
        return "bzip2", "application/x-bzip2"
    if data[:2] in _ZLIB_HEADERS and _inflates(data[:4096]):
        return "zlib", "application/zlib"
    if _ZIP_END in data[-_ZIP_END_SPAN:]:
        return "zip", "application/zip"
    if data[:1024].lstrip().startswith(b"%PDF-") and any(f in data for f in _PDF_FILTERS):
        return "PDF (compressed or encoded streams)", "application/pdf"
    return None


def _inflates(head: bytes) -> bool:
    """Whether `head` starts a zlib stream (text such as "x^2" shares its first bytes)."""
    try:
        zlib.decompressobj().decompress(head, 1024)
    except zlib.error:
        return False
    return True


def mask_bytes(data: bytes, secrets: Iterable[str]) -> bytes:
    """`data` with each secret, as bytes of each of ENCODINGS, replaced by as many bytes of
    `*` in the same encoding: the length (and so any offsets in a binary format) is kept.
    Longer secrets first, so one inside another is masked whole."""
    for value in sorted({v for v in secrets if v}, key=len, reverse=True):
        for encoding in ENCODINGS:
            try:
                needle = value.encode(encoding)
            except UnicodeEncodeError:
                continue  # a secret latin-1 cannot write cannot appear as latin-1
            if needle in data:
                star = "*".encode(encoding)
                data = data.replace(needle, star * (len(needle) // len(star)))
    return data


def check_may_read(*, name: str, content_type: str, data: bytes | None, reader: Principal) -> None:
    """Refuse (403, naming why) an artifact floom could not scan for secrets to a reader that
    may not run workers (the read scope was checked before). Judged by the recorded content
    type and, where the bytes are at hand, by their first bytes too (an artifact collected
    before floom marked them)."""
    found = content_type in UNSCANNABLE_TYPES
    kind = content_type
    if not found and data is not None:
        detected = unscannable_kind(data)
        if detected is not None:
            found, kind = True, detected[0]
    if not found or reader.can(SCOPE_FOR_UNSCANNABLE):
        return
    raise Forbidden(
        f"artifact '{name}' is {kind} data that floom cannot scan for secrets, so only keys "
        f"with the '{SCOPE_FOR_UNSCANNABLE}' scope may read it",
        hint="ask for a key with the run scope, or have the worker leave the file uncompressed "
        "so floom can redact the secrets in it",
        details={"scope_needed": SCOPE_FOR_UNSCANNABLE, "reason": "unscannable"},
    )


def scanned(content_type: str) -> bool:
    """Whether an artifact of this recorded content type was scanned for secrets."""
    return content_type not in UNSCANNABLE_TYPES
