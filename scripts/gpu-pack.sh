#!/usr/bin/env bash
# Packs ./build for a machine with an NVIDIA GPU and CUDA at /usr/local/cuda but none of
# this project's other packages (scripts/gpu-checks.sh runs there). Writes build-gpu/
# (ignored by git): the programs the checks run (debug info stripped), the project's
# libraries, libraccel.so and the static libraries it links (raccel.torch is built there
# against that machine's PyTorch), the system libraries they load except glibc's,
# libstdc++ and libgcc (that machine's own are newer), and run.sh.
#   usage: bash scripts/gpu-pack.sh      then, there:  bash build-gpu/run.sh COMMAND...
set -euo pipefail
cd "$(dirname "$0")/.."
[[ ${1:-} == --help || ${1:-} == -h ]] && { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
build=$(pwd)/build
out=build-gpu
programs=(raccel-scheduler raccel-netaccel raccel-sandbox hostile-sandbox raccel-guestd raccel-run raccelctl raccel-bench hal_cuda_test
  sandbox_test isolation_test failover_test)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/python" "$out/syslib"
for p in "${programs[@]}"; do
  [[ -x $build/bin/$p ]] || { echo "gpu-pack: no $build/bin/$p (build first: bash scripts/setup.sh)" >&2; exit 1; }
  strip --strip-debug -o "$out/bin/$p" "$build/bin/$p"
done
[[ -d $build/lib ]] && cp -a "$build/lib/." "$out/lib/"
if [[ -f $build/python/raccel/libraccel.so ]]; then
  strip --strip-debug -o "$out/python/libraccel.so" "$build/python/raccel/libraccel.so"
  cp "$build"/transport/libraccel_transport.a "$build"/common/libraccel_common.a "$build"/schema/libraccel_schema.a "$out/python/"
fi
for f in "$out"/bin/* "$out"/lib/*.so* "$out"/python/*.so; do [[ -e $f ]] && ldd "$f" 2>/dev/null; done |
  awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libnvidia[^/]*)\.so' |
  while read -r l; do cp -L "$l" "$out/syslib/"; done
tar -C "$out" -cJf "$out/syslib.tar.xz" syslib && rm -rf "$out/syslib"
# Where the build lived: tests have it compiled in (their RACCEL_BIN_DIR and sources).
grep -E '^(CMAKE_HOME_DIRECTORY|CMAKE_CACHEFILE_DIR):' "$build/CMakeCache.txt" | sed 's/:INTERNAL=/=/' >"$out/paths"
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine, from the repository root: links this build where it was built,
# unpacks its system libraries, sets PATH and LD_LIBRARY_PATH, names the GPU, runs COMMAND.
set -euo pipefail
root=$(pwd)
[[ -d $root/build-gpu/bin ]] || { echo "run.sh: run it from the repository root, beside build-gpu/" >&2; exit 1; }
for key in CMAKE_HOME_DIRECTORY:"$root" CMAKE_CACHEFILE_DIR:"$root/build-gpu"; do
  dir=$(sed -n "s/^${key%%:*}=//p" build-gpu/paths)
  if [[ -n $dir && ! -e $dir ]]; then mkdir -p "$(dirname "$dir")"; ln -s "${key#*:}" "$dir"; fi
done
syslib=/tmp/raccel-gpu-syslib
[[ -d $syslib/syslib ]] || { mkdir -p "$syslib" && tar -C "$syslib" -xJf build-gpu/syslib.tar.xz; }
export LD_LIBRARY_PATH="$root/build-gpu/lib:$syslib/syslib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$root/build-gpu/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "run.sh: no nvidia-smi"
exec "$@"
RUN
echo "gpu-pack: $(du -sh "$out" | cut -f1) in $out/ (${#programs[@]} programs, $(tar -tJf "$out/syslib.tar.xz" | grep -c '\.so') system libraries)"
