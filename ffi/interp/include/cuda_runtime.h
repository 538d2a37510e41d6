// The CUDA interpreter's cuda_runtime.h: the runtime API plus the device built-ins
// (oxijax_interp.h) that nvcc would provide to a .cu file.
#pragma once

#include "cuda_runtime_api.h"
#include "oxijax_interp.h"
