#!/usr/bin/env bash
# An environment for benchmarks/recbole_compare.py: RecBole 1.2.1 beside recserve, without touching .venv.
# .venv-recbole sees .venv's packages (torch, numpy 1.26, recbole itself) through a .pth file and adds only
# what RecBole imports on the path the comparison uses (not ray: the script avoids RecBole's quick_start).
set -euo pipefail
[ -x .venv/bin/python ] || { echo "run make setup first" >&2; exit 1; }
python3 -m venv .venv-recbole
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
own=$(.venv-recbole/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$own/zz-recserve-venv.pth"
.venv-recbole/bin/pip install -q --no-deps "pandas<2.3" python-dateutil pytz tzdata scikit-learn joblib \
  threadpoolctl narwhals cloudpickle tensorboard absl-py markdown werkzeug tensorboard-data-server texttable thop \
  tabulate "colorlog==4.7.2" "colorama==0.4.4" six markupsafe
.venv-recbole/bin/python -c "from recbole.data import create_dataset; print('RecBole ready in .venv-recbole')"
