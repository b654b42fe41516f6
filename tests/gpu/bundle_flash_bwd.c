/* test_sim_flash_bwd.c as attnjit-gpu's `flash-bwd` subcommand (bundle.h) */
#include "bundle.h"
#define main gpu_flash_bwd_main
#include "../templates/test_sim_flash_bwd.c"
