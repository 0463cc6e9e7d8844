"""NumPy's side of the .npy/.npz interoperability tests (npy_test.cc, npz_test.cc).

  testdata_gen.py write DIR   writes arrays with NumPy (np.save, np.savez, np.savez_compressed,
                              plus big-endian, Fortran-order, version 2.0/3.0 and ZIP64 variants)
  testdata_gen.py check DIR   loads the files the C++ tests wrote and compares every value

Every array holds a known function of its C-order element index i; ExpectedArray in the C++ tests
computes the same values, bit for bit:
  f4: float32(i * 0.1 - 3.0)             f2: float16(float32(i * 0.1 - 3.0))
  f8: i * 0.1 - 3.0                      i4: i * 7919 - 100000
  i8: i * 3000000019 - 7
"""

import os
import sys
import zipfile

import numpy as np

# name: (dtype, shape)
ARRAYS = {
    "f4": ("<f4", (4, 6)),
    "f2": ("<f2", (5, 3)),
    "i4": ("<i4", (7,)),
    "i8": ("<i8", (2, 3, 4)),
    "f8": ("<f8", (6,)),
    "empty": ("<f4", (0, 128)),
    "scalar": ("<f8", ()),
}


def expected(dtype, shape):
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    kind = np.dtype(dtype)
    if kind == np.float32:
        values = (i * 0.1 - 3.0).astype(np.float32)
    elif kind == np.float16:
        values = (i * 0.1 - 3.0).astype(np.float32).astype(np.float16)
    elif kind == np.float64:
        values = i * 0.1 - 3.0
    elif kind == np.int32:
        values = (i * 7919 - 100000).astype(np.int32)
    else:
        values = i * 3000000019 - 7
    return values.reshape(shape)


def write(directory):
    arrays = {name: expected(*spec) for name, spec in ARRAYS.items()}
    for name, array in arrays.items():
        np.save(os.path.join(directory, name + ".npy"), array)
    # Variants the reader must convert.
    np.save(os.path.join(directory, "f4_fortran.npy"), np.asfortranarray(arrays["f4"]))
    np.save(os.path.join(directory, "i8_fortran.npy"), np.asfortranarray(arrays["i8"]))
    np.save(os.path.join(directory, "f4_big.npy"), arrays["f4"].astype(">f4"))
    np.save(os.path.join(directory, "f2_big.npy"), arrays["f2"].astype(">f2"))
    np.save(os.path.join(directory, "i8_big.npy"), arrays["i8"].astype(">i8"))
    for version in ((2, 0), (3, 0)):
        path = os.path.join(directory, "f4_v%d.npy" % version[0])
        with open(path, "wb") as f:
            np.lib.format.write_array(f, arrays["f4"], version=version)
    np.savez(os.path.join(directory, "savez.npz"), **arrays)
    np.savez_compressed(os.path.join(directory, "savez_compressed.npz"), **arrays)
    # With the ZIP64 limit at 0 Python writes the ZIP64 extra field in the central directory and
    # the ZIP64 end-of-central-directory record, as it does for members over 4 GiB.
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 0, 0
    try:
        np.savez(os.path.join(directory, "zip64.npz"), **arrays)
        np.savez_compressed(os.path.join(directory, "zip64_compressed.npz"), **arrays)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved


def compare(label, array, name):
    dtype, shape = ARRAYS[name]
    want = expected(dtype, shape)
    if array.dtype != want.dtype or array.shape != want.shape:
        return ["%s: %s %s, expected %s %s" % (label, array.dtype, array.shape, want.dtype,
                                               want.shape)]
    # Compare bit patterns so that -0.0, NaN payloads and rounding all count.
    if array.tobytes() != want.tobytes():
        return ["%s: values differ:\n%r\nexpected\n%r" % (label, array, want)]
    return []


def check(directory):
    errors = []
    files = sorted(os.listdir(directory))
    for file in files:
        path = os.path.join(directory, file)
        if file.endswith(".npy"):
            errors += compare(file, np.load(path), file[:-4])
        elif file.endswith(".npz"):
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()  # Checks every CRC-32.
                if bad is not None:
                    errors.append("%s: zipfile.testzip reports %s" % (file, bad))
            with np.load(path) as npz:
                if list(npz.keys()) != list(ARRAYS):
                    errors.append("%s: keys %s, expected %s" % (file, list(npz.keys()),
                                                               list(ARRAYS)))
                for name in npz.keys():
                    if name in ARRAYS:
                        errors += compare("%s[%s]" % (file, name), npz[name], name)
    if not files:
        errors.append("no files in " + directory)
    for error in errors:
        print(error)
    print("checked %d files, %d errors" % (len(files), len(errors)))
    return 1 if errors else 0


def main(argv):
    if len(argv) != 3 or argv[1] not in ("write", "check"):
        print(__doc__)
        return 2
    if argv[1] == "write":
        write(argv[2])
        return 0
    return check(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
