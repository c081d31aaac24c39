#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what device_check.sh installs on a GPU machine that has no package
# index: wheels of atlas-core and the plugins built from this checkout, and the dependencies the
# machine's image lacks (its python3 is 3.12 with CuPy, NumPy, tokenizers, torch and transformers).
set -euo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p .whl
rm -f .whl/atlas_*.whl
for package in . plugins/models/* plugins/gb10; do
    uv build --wheel -q -o .whl "$package"
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_31_x86_64 -d .whl \
    gguf==0.19.0 msgspec==0.22.0 litestar==2.25.0 uvicorn==0.54.0 llguidance==1.9.1 jsonschema==4.26.0 \
    importlib-metadata==10.2.0 lazy_importer rich-click==1.9.9 litestar-htmx==0.5.0 multipart==2.0.1 polyfactory==3.5.0 \
    referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 faker==40.54.0
du -sh .whl
