"""Static checks run once by the launcher: versions against the manifest, locale, user site.

Standard library + the framework + horovod only.
"""

import ctypes
import importlib
import json
import locale
import os
import platform
import re
import shutil
import site
import subprocess
import sys

from .common import FAIL, FRAMEWORK_MODULES, PASS, SKIP, gpu_absent, result, version_matches


class ManifestError(Exception):
    """The manifest is missing or unreadable (bad input: exit 2)."""


def load_manifest(path):
    import json
    if not path:
        raise ManifestError("no manifest given (--manifest PATH) and /opt/envbuilder/manifest.json "
                            "does not exist")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ManifestError("cannot read manifest %s: %s" % (path, exc.strerror or exc)) from None
    except ValueError as exc:
        raise ManifestError("manifest %s is not valid JSON: %s" % (path, exc)) from None
    if not isinstance(data, dict):
        raise ManifestError("manifest %s is not a JSON object" % path)
    expect = data.get("expect")
    if expect is None:
        raise ManifestError("manifest %s has no 'expect' section" % path)
    if not isinstance(expect, dict):
        raise ManifestError("manifest %s: 'expect' is not an object" % path)
    return data


def framework_module(expect):
    fw = expect.get("framework") or {}
    if not fw:
        return None
    return fw.get("module") or FRAMEWORK_MODULES.get(str(fw.get("name", "")).lower())


def framework_key(module):
    """'torch' -> 'pytorch', 'tensorflow' -> 'tensorflow' (the names horovod.frameworks uses)."""
    return "pytorch" if module == "torch" else "tensorflow"


# ----------------------------------------------------------------------------- native libraries

def loaded_libraries(pattern):
    """Paths of shared objects mapped into this process whose file name matches PATTERN."""
    found = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].strip()
                if re.search(pattern, os.path.basename(path)) and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def nccl_version_from_code(code):
    if code <= 0:
        return None
    if code >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        return "%d.%d.%d" % (code // 10000, (code % 10000) // 100, code % 100)
    return "%d.%d.%d" % (code // 1000, (code % 1000) // 100, code % 100)


def nccl_version_of(path):
    try:
        lib = ctypes.CDLL(path)
        fn = lib.ncclGetVersion
    except (OSError, AttributeError):
        return None
    code = ctypes.c_int(0)
    try:
        if fn(ctypes.byref(code)) != 0:
            return None
    except Exception:  # noqa: BLE001 - a foreign library
        return None
    return nccl_version_from_code(code.value)


def library_version_text(name, mode=ctypes.DEFAULT_MODE):
    """MPI_Get_library_version of the library NAME (a path or a soname the loader finds), or
    None; callable before MPI_Init."""
    try:
        fn = ctypes.CDLL(name, mode=mode).MPI_Get_library_version
    except (OSError, AttributeError):
        return None
    buf = ctypes.create_string_buffer(8192)
    length = ctypes.c_int(0)
    try:
        fn(buf, ctypes.byref(length))
    except Exception:  # noqa: BLE001 - a foreign library
        return None
    return buf.value.decode("utf-8", "replace").strip()


def mpi_library_version():
    """(flavor, version, raw text, path) from MPI_Get_library_version of the libmpi in use."""
    paths = loaded_libraries(r"^libmpi(ch)?\.so") or loaded_libraries(r"^libmpi")
    for path in paths:
        text = library_version_text(path)
        if text is None:
            continue
        flavor, version = parse_mpi_text(text)
        return flavor, version, text, path
    return None, None, "", None


def parse_mpi_text(text):
    """Flavor and version from `mpirun --version` or MPI_Get_library_version text."""
    patterns = (
        ("openmpi", r"Open MPI\)?\s*v?(\d+(?:\.\d+)+)"),
        ("intel-mpi", r"Intel\(R\) MPI Library[^\d]*(\d+(?:\.\d+)*)"),
        ("mvapich", r"MVAPICH2?\s*Version:?\s*(\d+(?:\.\d+)*\w*)"),
        ("mpich", r"MPICH Version:\s*(\d+(?:\.\d+)*\w*)"),
        ("mpich", r"HYDRA build details:\s*Version:\s*(\d+(?:\.\d+)*\w*)"),
    )
    for flavor, pat in patterns:
        m = re.search(pat, text, re.S)
        if m:
            return flavor, m.group(1)
    return None, None


def mpirun_version():
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if not exe:
        return None, None, "", None
    try:
        proc = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=30, text=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, str(exc), exe
    flavor, version = parse_mpi_text(proc.stdout)
    return flavor, version, proc.stdout.strip(), exe


# ----------------------------------------------------------------------------- checks

def _cmp(name, label, expected, installed, extra=""):
    if expected is None:
        detail = "%s %s (manifest expects none)" % (label, installed) if installed else \
            "%s: not present, not expected" % label
        return result(name, PASS, detail + extra,
                      figure=str(installed or "-"))
    if installed is None:
        return result(name, FAIL, "%s: not found, manifest expects %s%s" % (label, expected, extra),
                      figure="missing")
    if version_matches(expected, installed):
        return result(name, PASS, "%s %s matches manifest %s%s" % (label, installed, expected, extra),
                      figure=str(installed))
    return result(name, FAIL, "%s %s installed, manifest expects %s%s" % (label, installed, expected,
                                                                            extra),
                  figure="%s != %s" % (installed, expected))


def check_python(expect):
    return _cmp("versions.python", "Python", expect.get("python"), platform.python_version(),
                " (%s)" % sys.executable)


MACHINE_NAMES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


def check_arch(expect, machine=None):
    """The CPU architecture the image runs on (uname -m) against the one it was built for. Under
    emulation (qemu-user through binfmt_misc) the machine reads as the image's own, as it should."""
    machine = machine or platform.machine()
    want = expect.get("arch")
    if not want:
        return result("versions.arch", PASS, "%s (manifest names no architecture)" % machine, figure=machine)
    have = MACHINE_NAMES.get(machine, machine)
    if have == want:
        return result("versions.arch", PASS, "%s, as built" % machine, figure=machine)
    return result("versions.arch", FAIL, "this image is built for %s but runs on a %s machine: run it on "
                  "%s nodes (or rebuild with arch: %s)" % (want, machine, want, have),
                  figure="%s != %s" % (machine, want))


def import_framework(expect):
    """Import the manifest's framework; returns (module or None, error text)."""
    mod = framework_module(expect)
    if not mod:
        return None, "manifest names no framework"
    try:
        return importlib.import_module(mod), ""
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        return None, "import %s failed: %s: %s" % (mod, type(exc).__name__, exc)


def cudnn_version_from_code(v):
    if not v:
        return None
    if v >= 90000:   # cuDNN 9: major*10000 + minor*100 + patch
        return "%d.%d.%d" % (v // 10000, (v % 10000) // 100, v % 100)
    return "%d.%d.%d" % (v // 1000, (v % 1000) // 100, v % 100)


def wheel_libraries(pattern):
    """Libraries NVIDIA's wheels put in site-packages/nvidia/*/lib whose name matches PATTERN."""
    import glob
    found = []
    for entry in sys.path:
        for path in sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", "*"))):
            if re.search(pattern, os.path.basename(path)) and path not in found:
                found.append(path)
    return found


def cudnn_library_version():
    """(version, path) of the cuDNN library the image has, from cudnnGetVersion()."""
    cands = loaded_libraries(r"^libcudnn\.so") + wheel_libraries(r"^libcudnn\.so\.\d+$") + [
        "libcudnn.so.9", "libcudnn.so.8", "libcudnn.so.7", "libcudnn.so"]
    for name in cands:
        try:
            lib = ctypes.CDLL(name)
            fn = lib.cudnnGetVersion
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_size_t
        try:
            return cudnn_version_from_code(int(fn())), name
        except Exception:  # noqa: BLE001
            continue
    return None, None


def framework_build_info(fw_mod):
    """CUDA / cuDNN versions the framework was built for (None on CPU builds)."""
    info = {"cuda": None, "cudnn": None, "nccl": None}
    if fw_mod is None:
        return info
    if fw_mod.__name__ == "torch":
        info["cuda"] = getattr(getattr(fw_mod, "version", None), "cuda", None)
        if info["cuda"]:
            try:
                info["cudnn"] = cudnn_version_from_code(fw_mod.backends.cudnn.version())
            except Exception:  # noqa: BLE001
                pass
            try:
                nv = fw_mod.cuda.nccl.version()
                if isinstance(nv, tuple):
                    info["nccl"] = ".".join(str(x) for x in nv)
                elif nv:
                    info["nccl"] = nccl_version_from_code(int(nv))
            except Exception:  # noqa: BLE001
                pass
    else:
        try:
            build = fw_mod.sysconfig.get_build_info()
        except Exception:  # noqa: BLE001
            build = {}
        if build.get("is_cuda_build"):
            info["cuda"] = build.get("cuda_version")
            # build info names the major cuDNN only ('8'): the library says which one it is
            info["cudnn"] = cudnn_library_version()[0] or build.get("cudnn_version")
    return info


def check_framework(expect, fw_mod, err):
    fw = expect.get("framework") or {}
    if not fw:
        return result("versions.framework", SKIP, "manifest names no framework")
    label = "%s (%s)" % (fw.get("name"), framework_module(expect))
    if fw_mod is None:
        return result("versions.framework", FAIL, "%s: %s" % (label, err), figure="missing")
    installed = getattr(fw_mod, "__version__", None)
    return _cmp("versions.framework", label, fw.get("version"), installed,
                " (%s)" % os.path.dirname(getattr(fw_mod, "__file__", "") or ""))


def import_horovod_binding(expect):
    """Import horovod and the binding of the manifest's framework (loads its native library)."""
    hv = expect.get("horovod")
    if not hv:
        return None, None, ""
    try:
        hvd_pkg = importlib.import_module("horovod")
    except Exception as exc:  # noqa: BLE001
        return None, None, "import horovod failed: %s: %s" % (type(exc).__name__, exc)
    mod = framework_module(expect)
    binding = None
    err = ""
    if mod:
        name = "horovod.torch" if mod == "torch" else "horovod.tensorflow"
        try:
            binding = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            err = "import %s failed: %s: %s" % (name, type(exc).__name__, exc)
    return hvd_pkg, binding, err


def check_horovod(expect, hvd_pkg, err):
    hv = expect.get("horovod")
    if not hv:
        return result("versions.horovod", SKIP, "manifest expects no Horovod")
    if hvd_pkg is None:
        return result("versions.horovod", FAIL, err, figure="missing")
    note = " (%s)" % os.path.dirname(hvd_pkg.__file__ or "")
    if err:
        note += "; but " + err
    return _cmp("versions.horovod", "Horovod", hv.get("version"), getattr(hvd_pkg, "__version__", None),
                note)


def check_mpi(expect):
    exp = expect.get("mpi")
    lib_flavor, lib_version, lib_text, lib_path = mpi_library_version()
    run_flavor, run_version, run_text, run_exe = mpirun_version()
    found = []
    if lib_path:
        found.append("libmpi %s %s (%s)" % (lib_flavor or "?", lib_version or "?", lib_path))
    if run_exe:
        found.append("%s: %s %s" % (run_exe, run_flavor or "?", run_version or "?"))
    detail_found = "; ".join(found) if found else "no MPI library loaded and no mpirun on PATH"
    if not exp:
        return result("versions.mpi", PASS,
                      "manifest expects no MPI; found: %s" % detail_found,
                      figure=(lib_version or run_version or "-"))
    site = os.environ.get("ENVBUILDER_SITE_MPI_DIR")        # job.sbatch: cluster.site_mpi injected
    if site and lib_path and os.path.realpath(lib_path).startswith(os.path.realpath(site).rstrip("/") + "/"):
        # the site's MPI replaces the image's on purpose: mpi.library checks every rank loaded it
        return result("versions.mpi", PASS, "the site MPI under %s (cluster.site_mpi) replaces the image's "
                      "%s %s; found: %s" % (site, exp.get("flavor"), exp.get("version"), detail_found),
                      figure="%s %s" % (lib_flavor or "?", lib_version or "?"))
    flavor = lib_flavor or run_flavor
    version = lib_version or run_version
    problems = []
    if version is None:
        problems.append("no MPI found (%s)" % detail_found)
    else:
        if exp.get("flavor") and flavor and flavor != exp.get("flavor"):
            problems.append("MPI flavor %s, manifest expects %s" % (flavor, exp.get("flavor")))
        if exp.get("version") and not version_matches(exp.get("version"), version):
            problems.append("MPI %s %s installed, manifest expects %s" % (flavor, version,
                                                                           exp.get("version")))
        if not run_exe:
            problems.append("no mpirun/mpiexec on PATH (libmpi is there; the mpi controller "
                            "cannot start without it)")
        if lib_version and run_version and (lib_flavor, lib_version) != (run_flavor, run_version):
            problems.append("mpirun (%s %s) and the libmpi Horovod loads (%s %s) differ" % (
                run_flavor, run_version, lib_flavor, lib_version))
    figure = "%s %s" % (flavor or "?", version or "?")
    if problems:
        return result("versions.mpi", FAIL, "; ".join(problems) + "; found: " + detail_found,
                      figure=figure)
    return result("versions.mpi", PASS, "%s %s matches manifest %s %s; found: %s" % (
        flavor, version, exp.get("flavor"), exp.get("version"), detail_found), figure=figure)


def horovod_nccl_version(binding):
    """NCCL version Horovod's native library uses: a loaded libnccl, or a static copy."""
    for path in loaded_libraries(r"^libnccl"):
        v = nccl_version_of(path)
        if v:
            return v, path
    if binding is not None:
        for path in loaded_libraries(r"mpi_lib"):
            v = nccl_version_of(path)
            if v:
                return v, path + " (static)"
    return None, None


def cuda_runtime_version():
    """(version, path) from cudaRuntimeGetVersion() of the libcudart in use (no GPU needed)."""
    cands = loaded_libraries(r"^libcudart\.so") + wheel_libraries(r"^libcudart\.so\.\d+$") + [
        "libcudart.so"]
    for name in cands:
        try:
            fn = ctypes.CDLL(name).cudaRuntimeGetVersion
        except (OSError, AttributeError):
            continue
        code = ctypes.c_int(0)
        try:
            if fn(ctypes.byref(code)) != 0 or code.value <= 0:
                continue
        except Exception:  # noqa: BLE001
            continue
        return "%d.%d" % (code.value // 1000, (code.value % 1000) // 10), name
    return None, None


def nccl_library_version():
    """(version, path) of the NCCL library loaded or shipped in NVIDIA's wheels."""
    for path in loaded_libraries(r"^libnccl") + wheel_libraries(r"^libnccl\.so\.\d+$"):
        v = nccl_version_of(path)
        if v:
            return v, path
    return None, None


def compiled_archs(fw_mod):
    """GPU architectures the framework's kernels are built for, e.g. ['7.5', '8.0'] (no GPU needed)."""
    flags = ""
    if fw_mod is None:
        return None
    if fw_mod.__name__ == "torch":
        try:
            flags = fw_mod._C._cuda_getArchFlags() or ""      # what torch.cuda.get_arch_list() reads
        except Exception:  # noqa: BLE001
            return None
        found = re.findall(r"(?:sm|compute)_(\d+)", flags)
    else:
        try:
            flags = fw_mod.sysconfig.get_build_info().get("cuda_compute_capabilities") or []
        except Exception:  # noqa: BLE001
            return None
        found = re.findall(r"(\d+)", " ".join(flags))
    out = sorted({"%s.%s" % (f[:-1], f[-1]) for f in found}, key=arch_key)
    return out or None


def check_cuda_libraries(expect, fw_mod):
    """A GPU image's CUDA parts read from the libraries themselves, without a GPU."""
    if not expect.get("gpu"):
        return []
    out = []
    v, path = cuda_runtime_version()
    # with CUDA from PyPI the lock's runtime wheel is the expectation (it may be newer than the CUDA
    # the framework was built with, which versions.cuda checks)
    locked = expect.get("cuda_runtime")
    out.append(_cmp("versions.cuda_runtime", "CUDA runtime (cudaRuntimeGetVersion)", locked or expect.get("cuda"), v,
                    (" (%s)" % path if path else "") + (" (the lock's nvidia-cuda-runtime wheel)" if locked else "")))
    v, path = cudnn_library_version()
    out.append(_cmp("versions.cudnn_library", "cuDNN library (cudnnGetVersion)", expect.get("cudnn"), v,
                    " (%s)" % path if path else ""))
    v, path = nccl_library_version()
    out.append(_cmp("versions.nccl_library", "NCCL library (ncclGetVersion)", expect.get("nccl"), v,
                    " (%s)" % path if path else ""))
    want = expect.get("cuda_arch") or []
    if want:
        have = compiled_archs(fw_mod)
        if have is None:
            out.append(result("versions.cuda_arch", FAIL, "the framework names no compiled GPU architectures "
                              "(a CPU build?); the spec asks %s" % ", ".join(want), figure="none"))
        else:
            missing = [a for a in want if not covers(have, a)]
            out.append(result("versions.cuda_arch", FAIL if missing else PASS,
                              ("no kernels for %s; built for %s" % (", ".join(missing), ", ".join(have)))
                              if missing else "built for %s; covers %s" % (", ".join(have), ", ".join(want)),
                              figure=" ".join(have)))
    return out


def arch_key(v):
    """A compute capability as a comparable tuple: "8.6" -> (8, 6)."""
    return tuple(int(x) for x in v.split("."))


def covers(have, arch):
    """Kernels for ARCH exist: built for it exactly, or for an older one of the same major
    (binary compatibility within a major, CUDA C programming guide)."""
    return any(h == arch or (arch_key(h)[0] == arch_key(arch)[0] and arch_key(h) <= arch_key(arch)) for h in have)


def check_horovod_cuda_arch(expect, binding):
    """Horovod's own CUDA kernels (its NCCL operations' scaling and packing) serve the spec's GPUs:
    read from the binding's library (.nv_fatbin), without a GPU. A Horovod built for other arches
    imports and passes every CPU check, then fails at its first GPU all-reduce ("no kernel image is
    available for execution on the device")."""
    from .fatbin import dotted, kernels
    hv = expect.get("horovod") or {}
    want = expect.get("cuda_arch") or []
    if not (expect.get("gpu") and want and "nccl" in (hv.get("operations") or [])):
        return []
    name = "horovod.cuda_arch"
    libs = loaded_libraries(r"^mpi_lib") if binding is not None else []
    if not libs:
        return [result(name, FAIL, "Horovod's %s binding did not load, so its GPU kernels cannot be read"
                       % (framework_module(expect) or "framework"), figure="missing")]
    found = {"cubin": set(), "ptx": set()}
    for path in libs:
        for kind, sms in (kernels(path) or {}).items():
            found[kind].update(sms)
    cubins = [dotted(sm) for sm in sorted(found["cubin"])]
    ptx = [dotted(sm) for sm in sorted(found["ptx"])]
    figure = " ".join(cubins) + (" +PTX %s" % " ".join(ptx) if ptx else "") or "none"
    where = ", ".join(os.path.basename(p) for p in libs)

    # served by a cubin of the same major no newer (binary compatibility), or by PTX no newer (the
    # driver JIT-compiles it)
    missing = [a for a in want if not (covers(cubins, a) or any(arch_key(p) <= arch_key(a) for p in ptx))]
    if missing:
        return [result(name, FAIL, "no Horovod kernels for %s in %s (built for %s): its GPU operations fail there "
                       "with 'no kernel image is available'; rebuild with HOROVOD_BUILD_CUDA_CC_LIST naming them "
                       "(envbuilder sets it from cuda.compute_capability)" % (", ".join(missing), where, figure),
                       figure=figure)]
    return [result(name, PASS, "built for %s (%s); covers %s" % (figure, where, ", ".join(want)), figure=figure)]


def check_gpu_visible(expect, fw_mod, no_gpu):
    """A GPU image with no GPU visible is not verified: this check fails unless --no-gpu."""
    if not expect.get("gpu"):
        return []
    count = 0
    try:
        if fw_mod is not None and fw_mod.__name__ == "torch":
            count = fw_mod.cuda.device_count()
        elif fw_mod is not None:
            count = len(fw_mod.config.list_physical_devices("GPU"))
    except Exception:  # noqa: BLE001
        count = 0
    if count:
        return [result("gpu.visible", PASS, "%d GPU(s) visible" % count, figure=str(count))]
    status, why = gpu_absent(expect, no_gpu)
    return [result("gpu.visible", status, why, figure="none")]


def check_cuda_stack(expect, fw_mod, binding):
    info = framework_build_info(fw_mod)
    out = []
    fwname = getattr(fw_mod, "__name__", "framework")
    out.append(_cmp("versions.cuda", "CUDA (%s build)" % fwname, expect.get("cuda"), info["cuda"]))
    out.append(_cmp("versions.cudnn", "cuDNN (%s build)" % fwname, expect.get("cudnn"), info["cudnn"]))
    nccl, where = horovod_nccl_version(binding)
    if nccl:
        label = "NCCL (%s)" % where
    else:
        nccl, label = info["nccl"], "NCCL (%s's)" % fwname
    if nccl is None and fwname != "torch" and info["cuda"] and expect.get("nccl"):
        # TensorFlow's build info names no NCCL version and it loads libnccl only with GPUs;
        # the library itself is read by versions.nccl_library
        out.append(result("versions.nccl", SKIP, "%s's build info names no NCCL version and Horovod has no NCCL "
                          "operations; the library is checked by versions.nccl_library" % fwname, figure="-"))
        return out
    out.append(_cmp("versions.nccl", label, expect.get("nccl"), nccl))
    return out


def check_packages(expect):
    pkgs = expect.get("packages") or {}
    if not pkgs:
        return result("versions.packages", SKIP, "manifest pins no extra packages")
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return result("versions.packages", SKIP, "importlib.metadata missing (Python < 3.8)")
    bad = []
    good = []
    for dist, want in sorted(pkgs.items()):
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            bad.append("%s missing (manifest %s)" % (dist, want))
            continue
        if version_matches(str(want), have):
            good.append("%s %s" % (dist, have))
        else:
            bad.append("%s %s installed, manifest expects %s" % (dist, have, want))
    if bad:
        return result("versions.packages", FAIL, "; ".join(bad), figure="%d drifted" % len(bad))
    return result("versions.packages", PASS, ", ".join(good), figure="%d pinned" % len(good))


def installed_os_packages():
    """name -> version of every installed Debian package (dpkg), or None without dpkg."""
    import subprocess
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Version}\\n"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    have = {}
    for line in out.splitlines():
        name, _, version = line.partition(" ")
        have[name.split(":")[0]] = version
    return have


def check_os_packages(expect, installed=None):
    """The OS packages the lock pinned for the final stage are installed at those versions."""
    pins = expect.get("apt") or {}
    if not pins:
        return result("versions.apt", SKIP, "manifest pins no OS packages (no lock)")
    have = installed if installed is not None else installed_os_packages()
    if have is None:
        return result("versions.apt", SKIP, "no dpkg-query in this image")
    bad = drifted(pins, have)
    if bad:
        return result("versions.apt", FAIL, "; ".join(bad[:20]), figure="%d drifted" % len(bad))
    return result("versions.apt", PASS, "%d OS packages as locked" % len(pins), figure="%d pinned" % len(pins))


def drifted(pins, have):
    """What differs between the lock's pins and what is installed (name -> version each)."""
    bad = []
    for name, want in sorted(pins.items()):
        got = have.get(name)
        if got is None:
            bad.append("%s missing (lock %s)" % (name, want))
        elif got != want:
            bad.append("%s %s installed, lock has %s" % (name, got, want))
    return bad


def installed_conda_packages(prefix):
    """name -> version from PREFIX/conda-meta/*.json (one record per installed package, written by
    the installer); None when the folder is missing."""
    meta = os.path.join(prefix, "conda-meta")
    if not os.path.isdir(meta):
        return None
    have = {}
    for entry in sorted(os.listdir(meta)):
        if not entry.endswith(".json"):
            continue
        try:
            with open(os.path.join(meta, entry), encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("name"), str):
            have[rec["name"]] = str(rec.get("version"))
    return have


def check_conda_packages(expect, prefix=None):
    """The conda packages the lock pinned are installed at those versions (the prefix's conda-meta)."""
    pins = expect.get("conda") or {}
    if not pins:
        return result("versions.conda", SKIP, "manifest pins no conda packages (no lock)")
    prefix = prefix or os.environ.get("CONDA_PREFIX") or "/opt/conda"
    have = installed_conda_packages(prefix)
    if have is None:
        return result("versions.conda", FAIL, "no %s/conda-meta: the conda packages are not installed" % prefix,
                      figure="0 installed")
    bad = drifted(pins, have)
    extra = sorted(set(have) - set(pins))
    if extra:
        bad.append("not in the lock: %s" % ", ".join(extra[:10]))
    if bad:
        return result("versions.conda", FAIL, "; ".join(bad[:20]), figure="%d drifted" % len(bad))
    return result("versions.conda", PASS, "%d conda packages as locked in %s/conda-meta" % (len(pins), prefix),
                  figure="%d pinned" % len(pins))


def check_locale():
    lang = os.environ.get("LC_ALL") or os.environ.get("LC_CTYPE") or os.environ.get("LANG")
    enc = locale.getpreferredencoding(False)
    problems = []
    if not lang:
        problems.append("none of LC_ALL, LC_CTYPE, LANG is set (set LANG=C.UTF-8 in the image)")
    else:
        try:
            locale.setlocale(locale.LC_ALL, "")
        except locale.Error as exc:
            problems.append("locale %s is not installed in the image (%s)" % (lang, exc))
    if enc.replace("-", "").lower() != "utf8":
        problems.append("preferred encoding is %s, not UTF-8" % enc)
    fs = sys.getfilesystemencoding()
    if fs.replace("-", "").lower() != "utf8":
        problems.append("file system encoding is %s" % fs)
    if problems:
        return result("env.locale", FAIL, "; ".join(problems), figure=lang or "unset")
    return result("env.locale", PASS, "locale %s, encoding %s" % (lang, enc), figure=lang)


def check_user_site():
    user_site = None
    try:
        user_site = site.getusersitepackages()
    except Exception:  # noqa: BLE001
        pass
    on_path = [p for p in sys.path if user_site and os.path.abspath(p) == os.path.abspath(user_site)]
    flag = os.environ.get("PYTHONNOUSERSITE")
    detail = "user site %s %s; ENABLE_USER_SITE=%s; PYTHONNOUSERSITE=%s" % (
        user_site, "exists" if user_site and os.path.isdir(user_site) else "absent",
        site.ENABLE_USER_SITE, flag if flag is not None else "unset")
    if on_path:
        return result("env.user_site", FAIL, "user site-packages is on sys.path: %s (%s); set "
                      "PYTHONNOUSERSITE=1" % (on_path[0], detail), figure="leaks")
    return result("env.user_site", PASS, "no user site-packages on sys.path (%s)" % detail,
                  figure="isolated")


def run_static(expect, no_gpu=False):
    """All static checks, in report order. Imports the framework (only the manifest's one)."""
    import time
    out = []

    def timed(fn, *a):
        t0 = time.time()
        res = fn(*a)
        for r in (res if isinstance(res, list) else [res]):
            r["seconds"] = round(time.time() - t0, 3)
            out.append(r)

    timed(check_python, expect)
    timed(check_arch, expect)
    t0 = time.time()
    fw_mod, err = import_framework(expect)
    res = check_framework(expect, fw_mod, err)
    res["seconds"] = round(time.time() - t0, 3)   # includes the framework's import
    out.append(res)
    t0 = time.time()
    hvd_pkg, binding, hvd_err = import_horovod_binding(expect)
    res = check_horovod(expect, hvd_pkg, hvd_err)
    res["seconds"] = round(time.time() - t0, 3)
    out.append(res)
    # which distribution provides the framework, and oneDNN on (CPU TensorFlow): cpu_tf.py
    from .cpu_tf import check_distribution, check_onednn
    if (expect.get("framework") or {}).get("distribution"):
        timed(check_distribution, expect, fw_mod)
    if expect.get("cpu_env"):
        timed(check_onednn, expect, fw_mod)
    timed(check_mpi, expect)
    timed(check_cuda_stack, expect, fw_mod, binding)
    timed(check_cuda_libraries, expect, fw_mod)
    timed(check_horovod_cuda_arch, expect, binding)
    timed(check_gpu_visible, expect, fw_mod, no_gpu)
    timed(check_packages, expect)
    timed(check_os_packages, expect)
    if "conda" in expect:
        timed(check_conda_packages, expect)
    timed(check_locale)
    timed(check_user_site)
    return out
