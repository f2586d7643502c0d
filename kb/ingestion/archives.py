"""Opening ZIP-based documents (DOCX) without trusting what the archive says about itself.

A ZIP file declares its entries in a central directory that anyone can write: a few hundred KB
can announce gigabytes that inflate from runs of zeros, or hundreds of thousands of entries that
cost memory merely to list. So the directory is checked against the budgets before any part is
read (entry count first, before ``zipfile`` builds one object per entry), and parts are then read
in chunks, never whole. The count is that of the records ``zipfile`` would read, not the one the
end record states: ``zipfile`` reads records until it has consumed the directory's declared size,
whatever count the end record gives. The parts themselves are read by kb.ingestion.docx_text.
"""

import io
import struct
import zipfile

from django.conf import settings

from kb.errors import ErrorCode, KBError

# End of central directory record, and its ZIP64 locator and record (used past 65,535 entries).
_END_RECORD = struct.Struct("<4s4H2LH")
_DIRECTORY_RECORD = struct.Struct("<4s6H3L5H2L")
_DIRECTORY_RECORD_SIGNATURE = b"PK\x01\x02"
_END_RECORD_SIGNATURE = b"PK\x05\x06"
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_LOCATOR_SIGNATURE = b"PK\x06\x07"
_ZIP64_END_RECORD = struct.Struct("<4sQ2H2L4Q")
_ZIP64_END_RECORD_SIGNATURE = b"PK\x06\x06"
_MAX_COMMENT_BYTES = 65535
# Small XML parts (relationships, settings) legitimately shrink far more than 100:1; the ratio is
# only meaningful, and only dangerous, for large entries.
_RATIO_CHECKED_FROM_BYTES = 1024 * 1024
# What zipfile raises for a directory it cannot list: malformed or cut short, a name that is not
# the UTF-8 its flag says (UnicodeDecodeError, a ValueError), or a version it does not know.
UNREADABLE_ZIP = (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError)


def open_archive(data: bytes, *, kind: str) -> zipfile.ZipFile:
    """The archive, once its entries fit the budgets; LOAD_FAILED naming the budget otherwise."""
    entry_count = bounded_entry_count(data)
    if entry_count is not None and entry_count > settings.KB_ARCHIVE_MAX_ENTRIES:
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"The {kind} file holds more than {settings.KB_ARCHIVE_MAX_ENTRIES} entries (KB_ARCHIVE_MAX_ENTRIES)",
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except UNREADABLE_ZIP as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"The {kind} file could not be read: {exc}") from None
    _check_declared_sizes(archive, kind)
    return archive


def bounded_entry_count(data: bytes) -> int | None:
    """How many entries ``zipfile`` would list, counted up to one past KB_ARCHIVE_MAX_ENTRIES (the
    count stops there), or None when the bytes have no end record.

    ``zipfile`` takes the directory to end where the end record (or the ZIP64 one) starts, and to
    be as long as declared; it reads records from there until that length is consumed. So are they
    counted here, from their fixed headers, without building anything."""
    position = data.rfind(_END_RECORD_SIGNATURE, max(0, len(data) - _END_RECORD.size - _MAX_COMMENT_BYTES))
    if position < 0 or position + _END_RECORD.size > len(data):
        return None
    directory_size = _END_RECORD.unpack_from(data, position)[5]
    directory_end = position
    zip64_record = _zip64_end_record(data, position)
    if zip64_record is not None:
        directory_end = zip64_record
        directory_size = _ZIP64_END_RECORD.unpack_from(data, zip64_record)[8]
    cursor, count = max(0, directory_end - directory_size), 0
    while cursor + _DIRECTORY_RECORD.size <= directory_end and count <= settings.KB_ARCHIVE_MAX_ENTRIES:
        record = _DIRECTORY_RECORD.unpack_from(data, cursor)
        if record[0] != _DIRECTORY_RECORD_SIGNATURE:
            break  # zipfile refuses such a directory as a bad ZIP file
        name_bytes, extra_bytes, comment_bytes = record[10:13]
        cursor += _DIRECTORY_RECORD.size + name_bytes + extra_bytes + comment_bytes
        count += 1
    return count


def _zip64_end_record(data: bytes, end_record_position: int) -> int | None:
    """Where the ZIP64 end record starts when a locator precedes the end record: as ``zipfile``
    reads it, right before the locator (not where the locator says)."""
    locator_position = end_record_position - _ZIP64_LOCATOR.size
    record_position = locator_position - _ZIP64_END_RECORD.size
    if record_position < 0 or data[locator_position : locator_position + 4] != _ZIP64_LOCATOR_SIGNATURE:
        return None
    if data[record_position : record_position + 4] != _ZIP64_END_RECORD_SIGNATURE:
        return None
    return record_position


def _check_declared_sizes(archive: zipfile.ZipFile, kind: str) -> None:
    total = 0
    for entry in archive.infolist():
        if entry.file_size > settings.KB_ARCHIVE_MAX_ENTRY_BYTES:
            raise KBError(
                ErrorCode.LOAD_FAILED,
                f"The {kind} file's part {entry.filename[:200]!r} inflates to {entry.file_size} bytes; the limit "
                f"is {settings.KB_ARCHIVE_MAX_ENTRY_BYTES} (KB_ARCHIVE_MAX_ENTRY_BYTES)",
            )
        ratio = entry.file_size / max(entry.compress_size, 1)
        if entry.file_size >= _RATIO_CHECKED_FROM_BYTES and ratio > settings.KB_ARCHIVE_MAX_RATIO:
            raise KBError(
                ErrorCode.LOAD_FAILED,
                f"The {kind} file's part {entry.filename[:200]!r} inflates {ratio:.0f} times; the limit is "
                f"{settings.KB_ARCHIVE_MAX_RATIO} (KB_ARCHIVE_MAX_RATIO)",
            )
        total += entry.file_size
    if total > settings.KB_ARCHIVE_MAX_TOTAL_BYTES:
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"The {kind} file inflates to {total} bytes; the limit is {settings.KB_ARCHIVE_MAX_TOTAL_BYTES} "
            "(KB_ARCHIVE_MAX_TOTAL_BYTES)",
        )
