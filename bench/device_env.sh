# shellcheck shell=bash
# Activate the offline device kit (built here by bench/make_kit.sh) on the GPU machine.
#
#   source bench/device_env.sh        # from the repo root; .kit/ must be present
#
# What it does (the unpack and venv steps run once per kit; a later source reuses them):
#   * unpacks .kit/{triton,perf_analyzer,wheels}.tar.xz into $KIT_ROOT (/tmp/kit);
#   * makes a plain venv $KIT_ROOT/venv from the image's python and installs the kit
#     wheels (numpy 1.26.4, tritonclient 2.51 + grpc/http deps) into its site-packages;
#     a .pth file there appends the image's site-packages, so torch, safetensors and
#     tokenizers come from the image while numpy 1.26 from the venv wins;
#   * exports PATH (venv first: the Triton python stub takes its interpreter, hence its
#     site-packages, from the python3 found on PATH), LD_LIBRARY_PATH (Triton's libs and
#     the image's libpython, which the stub links), TRITONSERVER_BIN, TRITON_BACKENDS_DIR,
#     TRITON_CACHES_DIR, PERF_ANALYZER, KIT_PYTHON, PY_SPY;
#   * prints one summary line; on any problem prints why and returns non-zero.
#
# Knobs: IMAGE_PYTHON [/opt/torch/.venv/bin/python3], KIT_SRC [<repo>/.kit],
#        KIT_ROOT [/tmp/kit].
# Expected: `import transformers` fails in this venv (the image's scipy needs numpy 2).

_kit_err() { printf 'device_env: ERROR: %s\n' "$*" >&2; }

# _kit_untar <archive.tar.xz> <dest dir>: GNU tar needs the xz program for -J; fall back
# to Python's tarfile/lzma where the image has no xz.
_kit_untar() {
    mkdir -p "$2" || return 1
    if command -v xz >/dev/null 2>&1; then
        tar -C "$2" -xJf "$1"
    else
        "$_kit_image_py" - "$1" "$2" <<'EOF'
import sys, tarfile
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2], **kw)
EOF
    fi
}

# _kit_prepend VAR DIR: put DIR first in the colon list VAR, once.
_kit_prepend() {
    local cur=${!1:-}
    case ":$cur:" in
        *":$2:"*) cur=":$cur:"; cur=${cur//":$2:"/:}; cur=${cur#:}; cur=${cur%:} ;;
    esac
    export "$1=$2${cur:+:$cur}"
}

_kit_main() {
    local repo kit_src kit_root f key py_ver kit_py vpy vsp
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1
    kit_src=${KIT_SRC:-$repo/.kit}
    kit_root=${KIT_ROOT:-/tmp/kit}
    _kit_image_py=${IMAGE_PYTHON:-/opt/torch/.venv/bin/python3}

    # --- inputs ---------------------------------------------------------------------
    for f in triton.tar.xz perf_analyzer.tar.xz wheels.tar.xz MANIFEST.txt; do
        [[ -f $kit_src/$f ]] || {
            _kit_err "$kit_src/$f missing (build the kit with bench/make_kit.sh and bring .kit/ along)"
            return 1
        }
    done
    [[ -x $_kit_image_py ]] || { _kit_err "image python not found: $_kit_image_py (set IMAGE_PYTHON)"; return 1; }
    py_ver=$("$_kit_image_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
        { _kit_err "$_kit_image_py does not run"; return 1; }
    kit_py=$(sed -n 's/^target_python=//p' "$kit_src/MANIFEST.txt")
    [[ $kit_py == "$py_ver" ]] || {
        _kit_err "kit was built for Python $kit_py (stub + wheels) but $_kit_image_py is $py_ver"
        return 1
    }
    [[ $kit_root == /?* && $kit_root != *" "* ]] || { _kit_err "KIT_ROOT must be an absolute path without spaces: $kit_root"; return 1; }
    command -v sha256sum >/dev/null 2>&1 || { _kit_err "sha256sum missing"; return 1; }

    # --- unpack + venv, once per (kit, image python) --------------------------------------
    key=$(cd "$kit_src" && sha256sum triton.tar.xz perf_analyzer.tar.xz wheels.tar.xz) || return 1
    key="$key"$'\n'"image_python=$_kit_image_py"
    vpy=$kit_root/venv/bin/python3
    if [[ -f $kit_root/.stamp && $(<"$kit_root/.stamp") == "$key" && -x $vpy ]]; then
        :
    else
        if [[ -e $kit_root ]]; then
            if [[ -f $kit_root/.kit-root || -z $(ls -A "$kit_root" 2>/dev/null) ]]; then
                rm -rf "$kit_root" || { _kit_err "cannot remove old $kit_root"; return 1; }
            else
                _kit_err "$kit_root exists and was not made by this script; remove it or set KIT_ROOT"
                return 1
            fi
        fi
        if ! { mkdir -p "$kit_root" && : >"$kit_root/.kit-root"; }; then
            _kit_err "cannot create $kit_root"
            return 1
        fi
        printf 'device_env: unpacking %s into %s\n' "$kit_src" "$kit_root" >&2
        if ! { _kit_untar "$kit_src/triton.tar.xz" "$kit_root/triton" &&
            _kit_untar "$kit_src/perf_analyzer.tar.xz" "$kit_root/perf_analyzer" &&
            _kit_untar "$kit_src/wheels.tar.xz" "$kit_root"; }; then
            _kit_err "unpacking the kit failed"
            return 1
        fi

        # The image python is itself a venv: --system-site-packages would expose the base
        # interpreter's site-packages, not the image venv's torch.  So: plain venv + .pth.
        "$_kit_image_py" -m venv --without-pip "$kit_root/venv" ||
            { _kit_err "python -m venv failed"; return 1; }
        vsp=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
            [[ -d $vsp ]] || { _kit_err "venv site-packages not found"; return 1; }

        if "$_kit_image_py" -m pip --version >/dev/null 2>&1; then
            PIP_NO_INDEX=1 "$_kit_image_py" -m pip install -q --no-index --no-deps \
                --disable-pip-version-check --no-warn-script-location \
                --target "$vsp" "$kit_root"/wheels/*.whl ||
                { _kit_err "pip install of the kit wheels failed"; return 1; }
        else
            # No pip in the image: a wheel is a zip, unpack it (purelib/platlib only).
            printf 'device_env: no pip in %s, unpacking wheels directly\n' "$_kit_image_py" >&2
            "$_kit_image_py" - "$vsp" "$kit_root"/wheels/*.whl <<'EOF' ||
import pathlib, shutil, sys, zipfile
dest = pathlib.Path(sys.argv[1])
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            target = dest.joinpath(*parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)
EOF
                { _kit_err "unpacking the kit wheels failed"; return 1; }
        fi

        # Append the image's site-packages after the venv's own (addsitedir also runs the
        # .pth files found there, as the image's own interpreter would).
        "$_kit_image_py" - "$vsp/zz_image_site_packages.pth" <<'EOF' ||
import site, sys
dirs = [d for d in site.getsitepackages()]
with open(sys.argv[1], "w") as f:
    for d in dirs:
        f.write(f"import site; site.addsitedir({d!r})\n")
EOF
            { _kit_err "writing the .pth for the image site-packages failed"; return 1; }
        printf '%s' "$key" >"$kit_root/.stamp"
    fi

    # --- environment ------------------------------------------------------------------------
    local ts_dir=$kit_root/triton/pytriton/tritonserver
    export KIT_ROOT=$kit_root
    export KIT_PYTHON=$vpy
    export TRITONSERVER_BIN=$ts_dir/bin/tritonserver
    export TRITON_BACKENDS_DIR=$ts_dir/backends
    export TRITON_CACHES_DIR=$ts_dir/caches
    export PERF_ANALYZER=$kit_root/perf_analyzer/perf_analyzer
    # py-spy's binary, where pip --target put the wheel's scripts.
    local spy
    spy=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bin/py-spy
    [[ -x $spy ]] && export PY_SPY=$spy
    for f in "$TRITONSERVER_BIN" "$TRITON_BACKENDS_DIR/python/libtriton_python.so" \
        "$TRITON_BACKENDS_DIR/python/triton_python_backend_stub" "$PERF_ANALYZER"; do
        [[ -x $f || -f $f ]] || { _kit_err "missing after unpack: $f (rm -rf $kit_root and retry)"; return 1; }
    done
    _kit_prepend PATH "$kit_root/venv/bin"

    # The stub links libpython<X.Y>.so.1.0; point the loader at the image's copy.
    local pylib pylibdir
    pylib="libpython$py_ver.so.1.0"
    pylibdir=$("$_kit_image_py" - "$pylib" <<'EOF'
import os, sys, sysconfig
name = sys.argv[1]
exe = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
for d in (sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib"),
          os.path.join(os.path.dirname(os.path.dirname(exe)), "lib")):
    if d and os.path.isfile(os.path.join(d, name)):
        print(d)
        break
EOF
)
    if [[ -n $pylibdir ]]; then
        _kit_prepend LD_LIBRARY_PATH "$pylibdir"
    else
        local ldc
        ldc=$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)
        [[ $ldc == *"$pylib "* ]] || {
            _kit_err "$pylib not found next to $_kit_image_py nor by ldconfig; the Triton python stub needs it"
            return 1
        }
    fi
    _kit_prepend LD_LIBRARY_PATH "$kit_root/triton/nvidia_pytriton.libs"

    if command -v ldd >/dev/null 2>&1; then
        local out
        for f in "$TRITONSERVER_BIN" "$TRITON_BACKENDS_DIR/python/libtriton_python.so" \
            "$TRITON_BACKENDS_DIR/python/triton_python_backend_stub"; do
            out=$(ldd "$f" 2>&1) || true
            if [[ $out == *"not found"* ]]; then
                _kit_err "unresolved libraries for $f:"
                grep 'not found' <<<"$out" >&2
                return 1
            fi
        done
        out=$(LD_LIBRARY_PATH=$kit_root/perf_analyzer/lib ldd "$kit_root/perf_analyzer/bin/perf_analyzer" 2>&1) || true
        if [[ $out == *"not found"* ]]; then
            _kit_err "unresolved libraries for perf_analyzer:"
            grep 'not found' <<<"$out" >&2
            return 1
        fi
    fi

    # --- summary ------------------------------------------------------------------------------
    local py3 pa_ver summary
    py3=$(command -v python3)
    [[ $py3 == "$kit_root/venv/bin/python3" ]] ||
        { _kit_err "python3 on PATH is $py3, not the kit venv"; return 1; }
    pa_ver=$("$PERF_ANALYZER" --version 2>&1 | head -n1) || true
    [[ $pa_ver == *"Perf Analyzer Version"* ]] ||
        { _kit_err "perf_analyzer does not run: $pa_ver"; return 1; }
    pa_ver=${pa_ver##*Version }
    pa_ver=${pa_ver%% *}
    summary=$(python3 - "$kit_root/venv" 2>"$kit_root/env_check.err" <<'EOF'
import importlib, os, sys, warnings
warnings.simplefilter("ignore")
venv = os.path.realpath(sys.argv[1])
bad, parts = [], [f"python3={sys.executable} ({sys.version.split()[0]})"]

import numpy
np_where = "kit venv" if os.path.realpath(numpy.__file__).startswith(venv) else numpy.__file__
parts.append(f"numpy={numpy.__version__} ({np_where})")
if not numpy.__version__.startswith("1.") or np_where != "kit venv":
    bad.append("numpy 1.x from the kit venv")

def probe(name, extra=None):
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        parts.append(f"{name}=FAILED({type(exc).__name__}: {exc})")
        bad.append(name)
        return None
    parts.append(f"{name}={getattr(mod, '__version__', '?')}" + (extra(mod) if extra else ""))
    return mod

probe("torch", lambda t: f" (cuda {t.version.cuda})")
probe("safetensors")
probe("tokenizers")
try:
    import tritonclient.grpc, tritonclient.http  # noqa: F401
    from importlib.metadata import version
    parts.append(f"tritonclient={version('tritonclient')}[grpc,http]")
except Exception as exc:
    parts.append(f"tritonclient=FAILED({type(exc).__name__}: {exc})")
    bad.append("tritonclient")
print(" ".join(parts))
if bad:
    print("missing or wrong: " + ", ".join(bad), file=sys.stderr)
    sys.exit(1)
EOF
) || {
        [[ -n $summary ]] && printf 'device_env: %s\n' "$summary" >&2
        _kit_err "python check failed:"
        tail -n 20 "$kit_root/env_check.err" >&2
        return 1
    }
    printf 'device_env: %s perf_analyzer=%s tritonserver=%s\n' \
        "$summary" "$pa_ver" "$TRITONSERVER_BIN"
}

if _kit_main; then _kit_rc=0; else _kit_rc=1; fi
unset -f _kit_main _kit_err _kit_untar _kit_prepend
unset _kit_image_py
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    echo "device_env: note: this file is meant to be sourced (source bench/device_env.sh); the exports are lost" >&2
fi
if [[ $_kit_rc -ne 0 ]]; then
    unset _kit_rc
    echo "device_env: FAILED (see above)" >&2
    # shellcheck disable=SC2317  # exit only runs when the file was executed, not sourced
    return 1 2>/dev/null || exit 1
fi
unset _kit_rc
