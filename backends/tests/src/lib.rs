//! Tests of the GPU backends that reach above the tensor crate: `fit` on MNIST, mixed
//! precision, the NumPy API and the register-tiled GEMM checked against the CPU backend
//! (`tests/`). A backend crate depends on `ferroflow-tensor` alone, tests included; what
//! needs Keras, the optimizers or a second backend lives here (as burn's
//! `burn-backend-tests`). The library is empty.
