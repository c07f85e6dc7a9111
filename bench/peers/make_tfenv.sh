#!/usr/bin/env bash
# Create the bench-only virtual environment with tensorflow-cpu for the tf.data contender.
#
#   bench/peers/make_tfenv.sh [ENV_DIR]        (default: /tmp/tfenv)
#
# Does nothing when ENV_DIR already has a Python that imports tensorflow.
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
env_dir="${1:-/tmp/tfenv}"
python="${PYTHON:-python3}"
if [ -x "$env_dir/bin/python" ] && "$env_dir/bin/python" -c "import tensorflow" 2>/dev/null; then
    echo "$env_dir already has tensorflow $("$env_dir/bin/python" -c 'import tensorflow as tf; print(tf.__version__)')"
    exit 0
fi
"$python" -m venv "$env_dir"
"$env_dir/bin/python" -m pip install --quiet --upgrade pip
"$env_dir/bin/python" -m pip install --quiet -r "$here/requirements.txt"
"$env_dir/bin/python" -c "import tensorflow as tf; print('tensorflow', tf.__version__, 'in $env_dir')"
