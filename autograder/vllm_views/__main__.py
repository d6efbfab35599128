import sys

from autograder.vllm_views import main

sys.exit(main())
