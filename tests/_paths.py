"""Where things are, for tests in any folder under tests/: the checkout (ROOT) and tests/ itself
(TESTS, which holds the shared helpers and the scripts tests start: _mp.py, _launch.py, _*_script.py,
porting/, fuzz/, fakecuda/)."""
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
