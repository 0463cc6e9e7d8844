
codescodes-1