# Sourced by the tools/gpu scripts on the GPU machine: where the system does not list cuBLASLt
# 13 (the binary loads it at run time for widths its own kernels cannot read), the pip wheel's
# copy that torch brought (nvidia/cu13/lib) goes on LD_LIBRARY_PATH.
if ! ldconfig -p | grep -q 'libcublasLt.so.13'; then
    cuda_libs=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
    if [[ -n "$cuda_libs" && -e "$cuda_libs/libcublasLt.so.13" ]]; then
        export LD_LIBRARY_PATH="$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
fi
