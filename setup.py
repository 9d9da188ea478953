"""Build step that pyproject.toml cannot express: install `recmas_ray_lmeval.pth` at the top of site-packages.

The .pth file runs `recmas_ray/_lmeval_hook.py`'s `install()` at interpreter start, which is how the bare
`lm_eval --model recmas_ray` command finds the model (lm-eval 0.4.13 has no plug-in entry points). A
regular wheel takes the file from build_lib; an editable install (PEP 660) takes files written to the
unpacked wheel's root, which is `install.install_lib` while setuptools builds an editable wheel.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_FILE = "recmas_ray_lmeval.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target_dir = self.get_finalized_command("install").install_lib
        else:
            target_dir = self.build_lib
        self.copy_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH_FILE),
                       os.path.join(target_dir, PTH_FILE))


setup(cmdclass={"build_py": BuildPyWithPth})
