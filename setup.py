"""The compiled parts of shardfeed (see src/shardfeed/format/native.py,
src/shardfeed/transforms/decode/png_rows.py, .../decode/crop_rows.py, .../decode/native_rows.py,
src/shardfeed/pipeline/produce.py and
src/shardfeed/sampling/crop_draws.py); the rest of the build is declared in pyproject.toml.
``optional``: where one cannot be compiled (no C compiler, no zlib headers), the package
installs without it and runs the Python code it stands in for, with the same results."""

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
            "shardfeed.sampling._draws",
            ["src/shardfeed/sampling/_draws.c"],
            # no fused multiply-add: every product and sum rounds as NumPy's and Python's do
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "shardfeed.transforms.decode._png",
            ["src/shardfeed/transforms/decode/_png.c"],
            libraries=["z"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            # format/_wire.c and transforms/decode/_png.c compiled into one call a slice
            "shardfeed.pipeline._slice",
            ["src/shardfeed/pipeline/_slice.c"],
            depends=["src/shardfeed/format/_wire.c", "src/shardfeed/transforms/decode/_png.c"],
            libraries=["z"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-unused-function"],
            optional=True,
        ),
        Extension(
            # libjpeg (libjpeg-turbo's libjpeg62 API) decodes; the resize is OpenCV's arithmetic
            "shardfeed.transforms.decode._jpeg_rows",
            ["src/shardfeed/transforms/decode/_jpeg_rows.c"],
            depends=["src/shardfeed/transforms/decode/_jpeg_errors.h"],
            libraries=["jpeg", "m"],
            # -O3: the resize's row loops are vectorised
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-clobbered", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            # format/_wire.c compiled in; libjpeg decodes (see pipeline/native_patches.py)
            "shardfeed.pipeline._jpeg_record",
            ["src/shardfeed/pipeline/_jpeg_record.c"],
            depends=["src/shardfeed/format/_wire.c",
                     "src/shardfeed/transforms/decode/_jpeg_errors.h"],
            libraries=["jpeg"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-unused-function", "-Wno-clobbered"],
            optional=True,
        ),
        Extension(
            "shardfeed.transforms.decode._jpeg_frames",
            ["src/shardfeed/transforms/decode/_jpeg_frames.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
