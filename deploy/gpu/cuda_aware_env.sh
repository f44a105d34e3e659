# Sourced by the issue-27 scripts: unpacks the CUDA-aware Open MPI + UCX carried as
# .gpu/cuda-aware-*.tar.xz (pack.sh) and puts it first, without the carried Debian UCX
# (the stack's must win). Sets CUDA_AWARE_OK=0 when there is no stack.
CUDA_AWARE_OK=0
tarball=$(ls .gpu/cuda-aware-*.tar.xz 2>/dev/null | head -1)
if [ -n "$tarball" ]; then
  [ -d .gpu/cuda-aware-stack ] || tar -xJf "$tarball" -C .gpu/
  P=$PWD/.gpu/cuda-aware-stack
  mkdir -p .gpu/lib-ca
  for f in .gpu/lib/*; do
    case "$(basename "$f")" in libucp* | libuct* | libucs* | libucm*) ;; *) ln -sf "$PWD/$f" .gpu/lib-ca/ ;; esac
  done
  export OPAL_PREFIX=$P PATH=$P/bin:$PATH LD_LIBRARY_PATH=$PWD/.gpu/lib-ca:$P/lib
  CUDA_AWARE_OK=1
fi
