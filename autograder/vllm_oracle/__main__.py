import sys

from autograder.vllm_oracle import main

sys.exit(main())
