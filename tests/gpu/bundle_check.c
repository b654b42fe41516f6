/* gpu_check.c as attnjit-gpu's `check` subcommand (bundle.h) */
#include "bundle.h"
#define main gpu_check_main
#include "gpu_check.c"
