// Error strings for the launchers' return codes.
#include "common.h"

extern "C" const char* td_error_string(int code) {
  switch (code) {
    case TD_OK: return "ok";
    case TD_BAD_DTYPE: return "unsupported dtype (float32 or bfloat16)";
    case TD_BAD_SHAPE: return "bad shape";
    case TD_K_NOT_ALIGNED: return "K is not a multiple of 16 (pad the operands at backend preparation)";
    case TD_TOPK_TOO_LARGE: return "top-k must be between 1 and 8 and at most the number of experts";
    case TD_TOO_MANY_EXPERTS: return "more than 1024 experts";
    default: return hipGetErrorString((hipError_t)code);
  }
}
