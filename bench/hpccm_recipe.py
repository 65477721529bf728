# hpccm recipe for the benchmark stack, written as an hpccm user would: building blocks where
# hpccm has one that works here, `shell` where it has none.
#
#   hpccm --recipe bench/hpccm_recipe.py --format docker --userarg framework=torch > Dockerfile
#   hpccm --recipe bench/hpccm_recipe.py --format docker --userarg framework=tf    > Dockerfile
#   (optional: --userarg pip=six:1.16.0 adds the extra pip pins the benchmark changes)
#
# Same stack as recipes/cpu-torch-horovod.yaml / recipes/cpu-tf-horovod.yaml: Debian bookworm base made locally,
# Python 3.11 in /opt/venv, torch 2.13.0+cpu (wheelhouse) or tensorflow-cpu 2.15.1, Horovod 0.28.1
# with MPI + Gloo (C++17 fix for torch), Debian's Open MPI. hpccm 26.5 (PyPI).
#
# Where hpccm's own blocks cannot be used on these machines (say so, they are not left out to
# make hpccm look worse):
# - `openmpi()` and `cmake()` download from open-mpi.org / GitHub, which are unreachable here:
#   Debian's packages through `packages()` instead (the same Open MPI 4.1.4 envbuilder uses).
# - `pip()` cannot add BuildKit mounts (CA secret, wheelhouse), so pip runs through
#   `shell(_arguments=...)`, hpccm's documented way to pass RUN options.
# - hpccm has no Debian mode: `_distro='ubuntu22'` selects its apt code paths.
# - pip-installed content has no runtime() in hpccm (hpccm PR #136), so the runtime stage copies
#   the venv explicitly, as hpccm's docs suggest for files a block does not carry.
# The last lines (manifest + smoke suite) are the benchmark's addition to every image, so that
# `envbuilder verify` runs the same suite in all three.

framework = USERARG.get('framework', 'torch')  # noqa: F821 (hpccm injects USERARG)
if framework not in ('torch', 'tf'):
    raise RuntimeError('--userarg framework=torch|tf')

VENV = '/opt/venv'
MOUNTS = ('--mount=type=secret,id=ca '
          '--mount=type=bind,source=wheelhouse,target=/wheelhouse')
PIP_ENV = ('export PIP_FIND_LINKS=/wheelhouse && '
           'if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi')
PIP = VENV + '/bin/pip install --no-cache-dir'

# ---- devel stage ------------------------------------------------------------------------------
Stage0 += baseimage(image='local/debian:bookworm-slim', _as='devel', _distro='ubuntu22')  # noqa: F821
Stage0 += python(python2=False, devel=True)  # noqa: F821
Stage0 += gnu(fortran=False)  # noqa: F821
Stage0 += packages(ospackages=['ca-certificates', 'cmake', 'make', 'python3-venv',  # noqa: F821
                               'libopenmpi-dev', 'openmpi-bin'])

if framework == 'torch':
    fw_req = 'torch==2.13.0+cpu'
    hvd_env = 'HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1'
    # Horovod 0.28.1 compiles its torch extension as C++14; torch >= 2.1 needs C++17 (horovod#3996).
    # numpy: the torch wheel does not bring it, and without it Horovod's broadcast_optimizer_state
    # fails on rank 1 while rank 0 hangs (the first benchmark run of this recipe did exactly that).
    fix = ['sed -i "s/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/" '
           '/tmp/horovod-0.28.1/CMakeLists.txt /tmp/horovod-0.28.1/horovod/torch/CMakeLists.txt']
else:
    fw_req = 'tensorflow-cpu==2.15.1'
    hvd_env = 'HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1'
    fix = []

Stage0 += shell(_arguments=MOUNTS, commands=[  # noqa: F821
    PIP_ENV,
    'python3 -m venv ' + VENV,
    PIP + ' pip==24.0 setuptools==69.5.1 wheel==0.43.0',
    PIP + ' ' + fw_req])

Stage0 += shell(_arguments=MOUNTS, commands=[  # noqa: F821
    PIP_ENV,
    VENV + '/bin/pip download --no-cache-dir --no-deps --no-binary :all: horovod==0.28.1 -d /tmp',
    'tar -xzf /tmp/horovod-0.28.1.tar.gz -C /tmp',
    *fix,
    PIP + ' cloudpickle psutil pyyaml packaging' + (' numpy' if framework == 'torch' else ''),
    hvd_env + ' HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1 '
    + PIP + ' --no-build-isolation /tmp/horovod-0.28.1',
    'rm -rf /tmp/horovod-0.28.1 /tmp/horovod-0.28.1.tar.gz'])

# The user's extra pins, last (the benchmark's rebuild changes one: --userarg pip=six:1.17.0;
# hpccm splits --userarg at every '=', so ':' stands for '==').
extra = USERARG.get('pip', '').replace(':', '==')  # noqa: F821
if extra:
    Stage0 += shell(_arguments=MOUNTS, commands=[PIP_ENV, PIP + ' ' + extra])  # noqa: F821

# ---- runtime stage ----------------------------------------------------------------------------
Stage1 += baseimage(image='local/debian:bookworm-slim', _distro='ubuntu22')  # noqa: F821
Stage1 += Stage0.runtime()  # noqa: F821  (python3 + python3-dev, gnu runtime libraries)
Stage1 += packages(ospackages=['ca-certificates', 'libopenmpi3', 'openmpi-bin'])  # noqa: F821
Stage1 += copy(_from='devel', src=VENV, dest=VENV)  # noqa: F821
Stage1 += environment(variables={'PATH': VENV + '/bin:$PATH', 'VIRTUAL_ENV': VENV,  # noqa: F821
                                 'OMPI_MCA_btl_vader_single_copy_mechanism': 'none',
                                 'LC_ALL': 'C.UTF-8'})

# Benchmark addition (not part of a user's recipe): the smoke suite, as envbuilder ships it.
Stage1 += copy(src='manifest.json', dest='/opt/envbuilder/manifest.json')  # noqa: F821
Stage1 += copy(src='envbuilder_smoke', dest='/opt/envbuilder/envbuilder_smoke')  # noqa: F821
Stage1 += shell(commands=[  # noqa: F821
    'echo /opt/envbuilder > ' + VENV + '/lib/python3.11/site-packages/envbuilder.pth'])
