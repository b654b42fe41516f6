/* test_sim_backward.c as attnjit-gpu's `backward` subcommand (bundle.h) */
#include "bundle.h"
#define main gpu_backward_main
#include "../templates/test_sim_backward.c"
