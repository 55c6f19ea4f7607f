import sys

from . import answer

stdout, code = answer(sys.argv[1], sys.argv[2], sys.argv[3:])
sys.stdout.write(stdout)
sys.exit(code)
