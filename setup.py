"""The compiled parts of shardfeed (see src/shardfeed/format/native.py and
src/shardfeed/transforms/decode/png_rows.py); the rest of the build is declared in
pyproject.toml. ``optional``: where one cannot be compiled (no C compiler, no zlib headers),
the package installs without it and runs the Python code it stands in for, with the same
results."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shardfeed.format._wire",
            ["src/shardfeed/format/_wire.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "shardfeed.transforms.decode._png",
            ["src/shardfeed/transforms/decode/_png.c"],
            libraries=["z"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
