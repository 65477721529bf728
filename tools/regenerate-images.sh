#!/usr/bin/env bash
# Re-render images/<name>/ for every preset in recipes/ (the test suite checks they are current).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] && python=.venv/bin/python
for recipe in recipes/*.yaml; do
    name=$("$python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' "$recipe")
    "$python" -m envbuilder build "$recipe" --no-build --out "images/$name" > /dev/null
    echo "images/$name"
done
