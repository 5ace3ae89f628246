# Run here (not on the device), in the repo root: the wheels the H200 image lacks for the server
# (versions as in this checkout's .venv on 2026-12-02); carry ".whl" and install them there
# with gpu.sh. fastapi >= 0.16x imports opentelemetry-api.
set -e
echo /.whl/ >> .git/info/exclude
for p in fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 soundfile==0.14.0 av==18.1.0 soxr==1.1.0 \
    ormsgpack==1.13.1 python-multipart==0.0.34 cffi==2.1.1 pycparser==3.12 opentelemetry-api==1.45.2; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 -d .whl "$p"
done
du -sh .whl  # ~40 MB of the 64 MiB a call may carry
