"""SYNTHESIZED ConnectX firmware image files for the emulated flint/mstflint (sandbox only, not a real image format).

A real image (fw-ConnectX8-rel-40_47_1026-<part>.bin) carries its PSID, version and device id inside (flint -i IMG
query reads them from the image, not from the file name). This stand-in keeps the same three facts in a small header
so the emulated `flint -i IMG query|verify` and `flint -d DEV -i IMG burn` can answer from the file itself:

    HWEMU-SYNTHETIC-FW-IMAGE v1\n
    {"psid": "MT_0000001217", "version": "40.47.1026", "device_id": 4131, ...}\n
    <filler bytes derived from the header, so two images of different versions have different sha256>

    python3 sandbox/hwemu/fwimage.py OUT.bin --psid MT_0000001217 --version 40.47.1026 [--corrupt]

`--corrupt` flips a byte of the filler: `verify` then fails the way a real image with a bad CRC does.
"""
import argparse
import hashlib
import json
import sys

MAGIC = b"HWEMU-SYNTHETIC-FW-IMAGE v1\n"
FILLER = 64 * 1024


def _filler(header_line, corrupt=False):
    seed = hashlib.sha256(header_line).digest()
    out = bytearray()
    while len(out) < FILLER:
        seed = hashlib.sha256(seed).digest()
        out += seed
    out = out[:FILLER - 32] + hashlib.sha256(bytes(out[:FILLER - 32])).digest()  # trailing "CRC" of the filler
    if corrupt:
        out[100] ^= 0xFF
    return bytes(out)


def write_image(path, psid, version, device_id=4131, release_date="10.11.2025", image_type="FS5", corrupt=False):
    header = {"psid": psid, "version": version, "device_id": int(device_id), "release_date": release_date,
              "image_type": image_type, "synthesized": True}
    line = json.dumps(header, sort_keys=True).encode() + b"\n"
    with open(path, "wb") as fh:
        fh.write(MAGIC + line + _filler(line, corrupt))
    return header


def read_image(path):
    """The header dict with 'crc_ok' (the filler's trailing hash holds), or None when the file is not such an image."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    if not data.startswith(MAGIC):
        return None
    rest = data[len(MAGIC):]
    nl = rest.find(b"\n")
    if nl < 0:
        return None
    try:
        header = json.loads(rest[:nl + 1])
    except ValueError:
        return None
    body = rest[nl + 1:]
    header["crc_ok"] = len(body) == FILLER and hashlib.sha256(body[:-32]).digest() == body[-32:]
    return header


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--psid", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--device-id", type=int, default=4131)
    p.add_argument("--corrupt", action="store_true")
    a = p.parse_args(argv)
    write_image(a.out, a.psid, a.version, a.device_id, corrupt=a.corrupt)
    with open(a.out, "rb") as fh:
        print(hashlib.sha256(fh.read()).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
